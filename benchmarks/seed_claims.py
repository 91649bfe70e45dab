"""The seed papers' methods at their own worker counts (issue 64, item 4): EC-DNN at K = 8, D-PSGD, RD-PSGD
and TopK on rings of 8 and 16, each on the comparison protocol (every method's rate chosen on seed 0, the
chosen rate judged on seeds 10, 11 and 12, which chose nothing).

Each cell is one or more `lowband compare` runs of the built-in suite (ecdnn or rdpsgd, MNIST-1D, cnn1d, 30
epochs, equal samples) with `--tune optim.lr=...`. A grid whose best rate sat at its edge was followed by
another grid beyond that edge, and a method's rate is the best on seed 0 over the union of its grids (its
held-out runs are those of the grid that chose that rate). The report marks a choice still at the union's
edge "open".

Run:     python benchmarks/seed_claims.py --run      (every comparison below into runs/seeds/; ~80 min on
                                                      the 2-core machine)
Report:  python benchmarks/seed_claims.py            (the tables, from benchmarks/results/seeds/, where --run
                                                      copies each comparison's report.md, summary.csv and
                                                      tuning.csv)
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "seeds")
HELD_OUT = ["--tune-on", "0", "--seeds", "10,11,12"]
GOSSIP = "allreduce,dpsgd,rdpsgd:p=0.5,rdpsgd:p=0.1,topk:p=0.1"
#: (folder, suite, workers, methods, rates): a cell's grids share the part of the folder before "-low"/"-high"
GRIDS = [
    ("rdpsgd-k8", "rdpsgd", 8, GOSSIP, "0.025,0.05,0.1"),
    ("rdpsgd-k8-low", "rdpsgd", 8, "rdpsgd:p=0.1,topk:p=0.1", "0.00625,0.0125,0.025"),
    ("rdpsgd-k16", "rdpsgd", 16, GOSSIP, "0.025,0.05,0.1"),
    ("rdpsgd-k16-low", "rdpsgd", 16, GOSSIP, "0.00625,0.0125,0.025"),
    ("ecdnn-k8", "ecdnn", 8, "local_sgd:tau=16,ensemble,ec_dnn:ensemble=simple,single,allreduce", "0.025,0.05,0.1"),
    ("ecdnn-k8-high", "ecdnn", 8, "ensemble,ec_dnn:ensemble=simple,single", "0.1,0.2,0.4"),
    ("ecdnn-k8-low", "ecdnn", 8, "local_sgd:tau=16", "0.00625,0.0125,0.025"),
]


def run(out: str) -> None:
    """Every grid through `lowband compare`, its records copied into RESULTS."""
    for folder, suite, workers, methods, rates in GRIDS:
        parent = os.path.join(out, folder)
        subprocess.run([sys.executable, "-m", "lowband", "compare", "--suite", suite, "--workers", str(workers),
                        "--methods", methods, "--tune", f"optim.lr={rates}", *HELD_OUT, "--out", parent], check=True)
        found = sorted(glob.glob(os.path.join(parent, "compare-*")))[-1]
        os.makedirs(os.path.join(RESULTS, folder), exist_ok=True)
        for name in ("report.md", "summary.csv", "tuning.csv"):
            shutil.copy(os.path.join(found, name), os.path.join(RESULTS, folder, name))


def rows(folder: str, name: str) -> list[dict]:
    with open(os.path.join(RESULTS, folder, name)) as f:
        return list(csv.DictReader(f))


def cell_of(folder: str) -> str:
    return folder.removesuffix("-low").removesuffix("-high")


def report() -> None:
    cells: dict[str, list[str]] = {}
    for folder, *_ in GRIDS:
        if os.path.isdir(os.path.join(RESULTS, folder)):
            cells.setdefault(cell_of(folder), []).append(folder)
    for cell, folders in cells.items():
        print(f"\n{cell}: rate chosen on seed 0 over {' + '.join(folders)}; val acc on seeds 10, 11, 12")
        print("| method | rates tried on seed 0 (val acc) | chosen | val acc, seeds 10-12 | mean ± sd | "
              "sent/worker MB |")
        print("|---|---|---|---|---|---|")
        for label in dict.fromkeys(r["label"] for f in folders for r in rows(f, "tuning.csv")):
            print(method_row(label, folders))


def method_row(label: str, folders: list[str]) -> str:
    """One method's line: every rate it tried on seed 0, the best (the grid that chose it gives the held-out
    runs), and whether that best is at the union's edge (open)."""
    tried = {}  # rate -> (val, status, folder)
    for f in folders:
        for r in rows(f, "tuning.csv"):
            if r["label"] == label:
                rate = float(r["value"])
                val = float(r["val"]) if r["val"] else float("nan")
                if rate not in tried or r["status"] == "ok":
                    tried[rate] = (val, r["status"], f)
    finished = {rate: v for rate, v in tried.items() if v[1] == "ok"}
    best = max(finished, key=lambda rate: finished[rate][0])
    edge = best in (min(tried), max(tried))
    judged = [f for f in folders for r in rows(f, "tuning.csv")
              if r["label"] == label and r["chosen"] == "yes" and float(r["value"]) == best]
    if not judged:  # no grid chose the union's best, so no held-out runs are at that rate
        return f"| {label} | (no grid chose {best:g}: not judged) | | | | |"
    held = [r for r in rows(judged[0], "summary.csv") if r["label"] == label]
    accs = [float(r["val_acc"]) for r in sorted(held, key=lambda r: int(r["seed"]))]
    sent = statistics.mean(float(r["bytes_sent_per_worker"]) for r in held) / 1e6
    shown = ", ".join(f"{rate:g} ({v[0]:.4f}{'' if v[1] == 'ok' else ' ' + v[1]})" for rate, v in sorted(tried.items()))
    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
    return (f"| {label} | {shown} | {best:g}{' (open)' if edge else ''} | {', '.join(f'{a:.4f}' for a in accs)} | "
            f"{statistics.mean(accs):.4f} ± {sd:.4f} | {sent:.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="run every comparison first (~80 min on 2 cores)")
    p.add_argument("--out", default="runs/seeds", help="parent of the comparisons --run makes (default runs/seeds)")
    args = p.parse_args()
    if args.run:
        run(args.out)
    report()


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `| head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
