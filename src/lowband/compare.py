"""Run several methods on the same data, model and seeds, one after another, and tabulate them.

A method is named alone (`allreduce`) or with options (`ec_dnn:ensemble=margin:tau=128`). When a
`local_sgd` (MA-DNN) run is among them, every row also gets the EC-DNN paper's "speed": the
training time MA-DNN_G needed to reach its own final accuracy divided by the time this
method's global (G) or best local (L) model needed to reach it; 0 if it never did.
"""

from __future__ import annotations

import csv
import tomllib
import os
import time
from importlib import resources

from lowband import config as C
from lowband import runs
from lowband.errors import ConfigError, UsageError
from lowband.metrics import human_bytes, median, read_metrics

COLUMNS = ["label", "method", "workers", "final_acc", "final_acc_L", "best_acc", "epochs",
           "bytes_sent_per_worker", "train_s", "samples_per_s", "speed_G", "speed_L", "status", "run_dir"]


def suite_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("lowband").joinpath("suites").iterdir() if p.name.endswith(".toml"))


def load_suite(name: str | None = None, path: str | None = None) -> dict:
    """A suite: {description, methods, target, config}; `name` is built in, `path` a user's TOML file."""
    if name is not None:
        if name not in suite_names():
            raise UsageError(f"unknown suite {name!r}; known: {', '.join(suite_names())} (or --config FILE)")
        raw = tomllib.loads(resources.files("lowband").joinpath("suites", f"{name}.toml").read_text())
    else:
        raw = C.read_toml(path)
    methods = raw.get("methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        raise ConfigError("methods", methods, "a suite needs methods = [\"name\", \"name:key=value\", ...]")
    prepare = raw.get("prepare", [])
    if not isinstance(prepare, list) or not all(isinstance(c, str) for c in prepare):
        raise ConfigError("prepare", prepare, "a list of lowband commands, e.g. [\"train --method single ...\"]")
    defaults = raw.get("method_defaults", {})
    if not isinstance(defaults, dict) or not all(isinstance(v, dict) for v in defaults.values()):
        raise ConfigError("method_defaults", defaults, "tables of options per method, e.g. [method_defaults.edl]")
    return {"description": raw.get("description", ""), "methods": methods, "config": raw.get("config", {}),
            "target": raw.get("target", "allreduce"), "prepare": prepare, "method_defaults": defaults}


def parse_spec(spec: str) -> tuple[str, dict]:
    """'ec_dnn:ensemble=margin:tau=128' -> ('ec_dnn', {'ensemble': 'margin', 'tau': 128})."""
    name, *options = spec.split(":")
    values = {}
    for item in options:
        path, value = C.parse_set(f"method.{item}")
        if len(path) != 2:
            raise ConfigError("--methods", spec, "options are KEY=VALUE, e.g. ec_dnn:ensemble=margin")
        values[path[1]] = value
    return name, values


def with_method(base: C.Config, spec: str, defaults: dict | None = None) -> C.Config:
    """`base` running `spec`; `defaults` holds a suite's options per method name (the spec's win)."""
    name, options = parse_spec(spec)
    raw = C.to_dict(base)
    inherited = raw["method"] if raw["method"]["name"] == name else {}
    raw["method"] = {**(defaults or {}).get(name, {}), **inherited, **options, "name": name}
    return C.from_dict(raw, runs.method_configs())


def compare(base: C.Config, specs: list[str], out: str, prepare: list[str] = (),
            method_defaults: dict | None = None) -> tuple[int, str, list[dict]]:
    """Returns (exit code, comparison directory, one row per method).

    `prepare`: lowband commands run first (e.g. training a teacher); "{folder}" in them and in
    the configs' strings is the comparison directory. `method_defaults`: options per method name.
    """
    folder = os.path.join(out, "compare-" + time.strftime("%Y%m%d-%H%M%S"))
    configs = [(spec, C.from_dict(fill(C.to_dict(with_method(base, spec, method_defaults)), folder),
                                  runs.method_configs()))
               for spec in specs]  # validate all before running any
    for _, cfg in configs:
        runs.world_size(cfg)
    for command in prepare:
        code = run_prepare(command.replace("{folder}", folder))
        if code:
            return code, folder, []
    rows = []
    for spec, cfg in configs:
        print(f"\n=== {spec} ===", flush=True)
        code, run_dir = runs.start(cfg, os.path.join(folder, spec.replace(":", "_").replace("=", "-")))
        if code == 130:
            return 130, folder, rows
        rows.append(summarize(spec, cfg, run_dir, code))
    add_speed(rows)
    write_csv(rows, os.path.join(folder, "summary.csv"))
    from lowband.report import build

    build([folder])
    return (0 if all(r["status"] == "ok" for r in rows) else 1), folder, rows


def fill(raw, folder: str):
    """`raw` with "{folder}" replaced in every string."""
    if isinstance(raw, dict):
        return {k: fill(v, folder) for k, v in raw.items()}
    if isinstance(raw, list):
        return [fill(v, folder) for v in raw]
    return raw.replace("{folder}", folder) if isinstance(raw, str) else raw


def run_prepare(command: str) -> int:
    import shlex
    import subprocess
    import sys

    print(f"\n=== prepare: lowband {command} ===", flush=True)
    return subprocess.run([sys.executable, "-m", "lowband", *shlex.split(command)]).returncode


def summarize(label: str, cfg: C.Config, run_dir: str, code: int) -> dict:
    records = read_metrics(run_dir)
    done = [r for r in records if r.get("test_acc") is not None]
    last = records[-1] if records else {}
    return {
        "label": label, "method": cfg.method.name, "workers": runs.world_size(cfg),
        "final_acc": done[-1]["test_acc"] if done else None, "final_acc_L": done[-1]["test_acc_L"] if done else None,
        "best_acc": max(r["test_acc"] for r in done) if done else None,
        "epochs": last.get("epoch", 0), "bytes_sent_per_worker": last.get("bytes_sent_per_worker", 0.0),
        "train_s": last.get("time", {}).get("train_s", 0.0), "speed_G": None, "speed_L": None,
        "samples_per_s": median([r["samples_per_s"] for r in records if r.get("samples_per_s")]),
        "status": "ok" if code == 0 else f"failed ({code})", "run_dir": run_dir, "_records": done,
    }


def time_to(records: list[dict], key: str, target: float) -> float | None:
    """Training seconds until `key` first reached `target` (None: never)."""
    return next((r["time"]["train_s"] for r in records if r.get(key) is not None and r[key] >= target), None)


def add_speed(rows: list[dict]) -> None:
    ref = next((r for r in rows if r["method"] == "local_sgd" and r["final_acc"] is not None), None)
    if ref is None:
        return
    t_ref = time_to(ref["_records"], "test_acc", ref["final_acc"])
    for r in rows:
        for key, col in (("test_acc", "speed_G"), ("test_acc_L", "speed_L")):
            t = time_to(r["_records"], key, ref["final_acc"])
            r[col] = 0.0 if t is None else t_ref / max(t, 1e-9)


def write_csv(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict]) -> str:
    speed = any(r["speed_G"] is not None for r in rows)
    head = ["method", "workers", "final acc", "acc L", "best acc", "epochs", "sent/worker", "train s", "samples/s"]
    head += ["speed G", "speed L"] if speed else []
    fmt = lambda v, d=4: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    body = []
    for r in rows:
        cells = [r["label"], str(r["workers"]), fmt(r["final_acc"]), fmt(r["final_acc_L"]), fmt(r["best_acc"]),
                 str(r["epochs"]), human_bytes(r["bytes_sent_per_worker"]), f"{r['train_s']:.1f}",
                 fmt(r.get("samples_per_s"), 0)]
        cells += [fmt(r["speed_G"], 2), fmt(r["speed_L"], 2)] if speed else []
        body.append(cells + ([] if r["status"] == "ok" else [r["status"]]))
    widths = [max(len(row[i]) if i < len(row) else 0 for row in [head] + body) for i in range(len(head) + 1)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths[:len(head)]])] + [line(b) for b in body])


def print_summary(rows: list[dict], folder: str) -> None:
    print("\n" + format_table(rows))
    print(f"\nruns, summary.csv and report.md/report.html (plots: accuracy vs epoch, bytes, time) in {folder}")
