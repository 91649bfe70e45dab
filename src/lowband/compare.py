"""Run several methods on the same data, model and seeds, one after another, and tabulate them.

A method is named alone (`allreduce`) or with options (`ec_dnn:ensemble=margin:tau=128`).
summary.csv has one row per run; the console table is lowband.table's, the same as the report's
(seeds pooled, one reference: the target accuracy, and speed-up against Allreduce).
"""

from __future__ import annotations

import csv
import sys
import types
import os
import time
from importlib import resources

import tomllib

from lowband import config as C
from lowband import runs, table
from lowband.errors import ConfigError, UsageError
from lowband.metrics import median, read_metrics

COLUMNS = ["label", "method", "seed", "workers", "val_acc", "val_acc_L", "final_acc", "final_acc_L", "best_val_acc",
           "epochs", "samples", "bytes_sent_per_worker", "train_s", "samples_per_s", "speedup", "status", "run_dir"]


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
    for i, (spec, cfg) in enumerate(configs, 1):
        print(f"\nrun {i}/{len(configs)}: {spec} seed {cfg.train.seed}", flush=True)
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
    """One run's row of summary.csv (final figures of its global model; `final_acc` is test accuracy),
    plus its records and link for the comparison table."""
    records = read_metrics(run_dir)
    done = [r for r in records if r.get("val_acc") is not None or r.get("test_acc") is not None]
    last, end = (records[-1] if records else {}), (done[-1] if done else {})
    return {
        "label": label, "method": cfg.method.name, "seed": cfg.train.seed, "workers": runs.world_size(cfg),
        "val_acc": end.get("val_acc"), "val_acc_L": end.get("val_acc_L"),
        "final_acc": end.get("test_acc"), "final_acc_L": end.get("test_acc_L"),
        "best_val_acc": max((r["val_acc"] for r in done if r.get("val_acc") is not None), default=None),
        "epochs": last.get("epoch", 0), "samples": last.get("samples"),
        "bytes_sent_per_worker": last.get("bytes_sent_per_worker", 0.0),
        "train_s": last.get("time", {}).get("train_s", 0.0), "speedup": None,
        "samples_per_s": median([r["samples_per_s"] for r in records if r.get("samples_per_s")]),
        "status": "ok" if code == 0 else f"failed ({code})", "run_dir": run_dir, "records": records,
    }


def time_to(records: list[dict], key: str, target: float) -> float | None:
    """Training seconds until `key` first reached `target` (None: never)."""
    return next((r["time"]["train_s"] for r in records if r.get(key) is not None and r[key] >= target), None)


def add_speed(rows: list[dict], target: float | None = None) -> None:
    """Give every run the comparison table's speed-up of its label (one reference: see lowband.table)."""
    by_label = {r["label"]: r["speedup"] for r in table.rows(rows, target)[0]}
    for r in rows:
        r["speedup"] = by_label.get(r["label"])


def write_csv(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict], target: float | None = None) -> str:
    """The comparison table (lowband.table) of these runs, as plain text, with its target."""
    body, target, why = table.rows(rows, target)
    return table.text(body) + "\n\n" + table.describe_target(target, why)


def print_summary(rows: list[dict], folder: str, target: float | None = None) -> None:
    print("\n" + format_table(rows, target))
    print(f"\nruns, summary.csv and report.md/report.html (plots: accuracy against epoch, bytes and time; "
          f"projected time to target against link rate; accuracy against bytes) in {folder}")


class _CallableModule(types.ModuleType):
    """`lowband.compare` is this module once imported (Python sets a package's submodules as its
    attributes); calling it is the Python API's `lowband.compare(...)` (lowband.api.compare)."""

    def __call__(self, *args, **kwargs):
        from importlib import import_module

        return import_module("lowband.api").compare(*args, **kwargs)  # the API sits above this module


sys.modules[__name__].__class__ = _CallableModule
