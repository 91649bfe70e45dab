"""How well the report's link projection predicts runs on a modelled slow link.

Runs a few methods once on an unlimited link (MNIST-1D, cnn1d, 4 workers by default), projects
each run's training seconds onto every link in --links with lowband.comparison.projection (the arithmetic
the modelled link charges), then runs the same comparison with `--link RATE` (--mode model, or
netns as root) and prints projected against measured training seconds and the error.
Goal: within 15%.

Run: nice python benchmarks/projection.py [--methods allreduce,local_sgd:tau=16] [--links 5mbit 20mbit]
     [--epochs 5] [--workers 4] [--mode model]
"""

import argparse
import os
import tempfile

from common import run_compare
from lowband.comparison.projection import seconds_through
from lowband.net.links import parse_link
from lowband.run.metrics import read_metrics


def compare(methods: str, workers: int, epochs: int, link: str, mode: str, out: str) -> dict[str, dict]:
    args = ["--methods", methods, "--workers", str(workers), "--epochs", str(epochs), "--link", link,
            "--link-mode", mode]
    return {r["label"]: r for r in run_compare(args, os.path.join(out, link.replace(",", "_")))}


def measured(row: dict) -> float | None:
    records = read_metrics(row["run_dir"])
    return records[-1].train_s if row["status"] == "ok" and records else None


def projected(row: dict, link: str) -> float | None:
    records = read_metrics(row["run_dir"])
    if row["status"] != "ok" or not records:
        return None
    return seconds_through(records, records[-1].epoch, parse_link(link))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="allreduce,local_sgd:tau=16")
    p.add_argument("--links", nargs="+", default=["5mbit", "20mbit"])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mode", default="model", choices=["model", "netns"])
    p.add_argument("--out", help="keep the comparisons here (default: a temporary directory)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or tmp
        print(f"{a.methods}, {a.workers} workers, {a.epochs} epochs, MNIST-1D cnn1d; link mode {a.mode}; each "
              "limited comparison runs right after the unlimited one it is projected from\n")
        print("| method | link | unlimited train s | projected s | measured s | error |")
        print("|---|---|---|---|---|---|")
        for link in a.links:
            base = compare(a.methods, a.workers, a.epochs, "unlimited", "model", os.path.join(out, f"base-{link}"))
            runs = compare(a.methods, a.workers, a.epochs, link, a.mode, out)
            for label, row in base.items():
                proj, meas = projected(row, link), measured(runs[label]) if label in runs else None
                err = f"{100 * (proj - meas) / meas:+.1f}%" if proj is not None and meas else "-"
                print(f"| {label} | {link} | {measured(row) or 0:.1f} | {proj or 0:.1f} | {meas or 0:.1f} | {err} |",
                      flush=True)


if __name__ == "__main__":
    main()
