"""Run several methods on the same data, model and seeds, one after another, and tabulate them."""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
import time

from lowband import config as C
from lowband import runs
from lowband.metrics import human_bytes, read_metrics

COLUMNS = ["method", "workers", "final_acc", "best_acc", "epochs", "bytes_sent_per_worker", "train_s", "status"]


def compare(base: C.Config, methods: list[str], out: str) -> tuple[int, str, list[dict]]:
    """Returns (exit code, comparison directory, one row per method)."""
    folder = os.path.join(out, "compare-" + time.strftime("%Y%m%d-%H%M%S"))
    configs = [with_method(base, m) for m in methods]  # validate every method before running any
    rows = []
    for cfg in configs:
        print(f"\n=== {cfg.method.name} ===", flush=True)
        code, run_dir = runs.start(cfg, os.path.join(folder, cfg.method.name))
        if code == 130:
            return 130, folder, rows
        rows.append(summarize(cfg, run_dir, code))
    write_csv(rows, os.path.join(folder, "summary.csv"))
    return (0 if all(r["status"] == "ok" for r in rows) else 1), folder, rows


def with_method(base: C.Config, name: str) -> C.Config:
    raw = C.to_dict(base)
    options = raw["method"] if raw["method"]["name"] == name else {}
    raw["method"] = {**options, "name": name}
    return C.from_dict(raw, runs.method_configs())


def summarize(cfg: C.Config, run_dir: str, code: int) -> dict:
    records = read_metrics(run_dir)
    accs = [r["test_acc"] for r in records if r.get("test_acc") is not None]
    last = records[-1] if records else {}
    return {
        "method": cfg.method.name, "workers": runs.world_size(cfg),
        "final_acc": accs[-1] if accs else None, "best_acc": max(accs) if accs else None,
        "epochs": last.get("epoch", 0), "bytes_sent_per_worker": last.get("bytes_sent_per_worker", 0.0),
        "train_s": last.get("time", {}).get("elapsed_s", 0.0),
        "status": "ok" if code == 0 else f"failed ({code})", "run_dir": run_dir,
    }


def write_csv(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + ["run_dir"])
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict]) -> str:
    head = ["method", "workers", "final acc", "best acc", "epochs", "sent/worker", "train s", "status"]
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    body = [[r["method"], str(r["workers"]), fmt(r["final_acc"]), fmt(r["best_acc"]), str(r["epochs"]),
             human_bytes(r["bytes_sent_per_worker"]), f"{r['train_s']:.1f}", r["status"]] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


def print_summary(rows: list[dict], folder: str, stream=sys.stdout) -> None:
    print("\n" + format_table(rows), file=stream)
    print(f"\nruns and summary.csv in {folder}", file=stream)


__all__ = ["compare", "format_table", "print_summary", "dataclasses"]
