"""AFSD paper's Tables 1-2 on MNIST-1D (cnn1d): 2 models on the same data, interval sweep.

Runs Allreduce (K = 2) and, for each update interval, codistillation and AFSD (2 models, data
`same`) in one `lowband compare`, once per seed. The target is Allreduce's mean final validation
accuracy; per method it prints the mean epoch at which validation accuracy first reached it (and
on how many seeds it did), mean ± sd final validation and test accuracy, and the bytes each worker
sent (checkpoints for codistillation/AFSD, gradients for Allreduce).

Run: python benchmarks/afsd.py [--intervals 10,50,200,1000,5000] [--epochs 30] [--seeds 0,1,2]
"""

import argparse
import os
import statistics
import tempfile

from common import commit, mean_sd, run_compare
from lowband.run.metrics import read_metrics


def earliest(run_dir: str, target: float) -> int | None:
    for r in read_metrics(run_dir):
        if r.val_acc is not None and r.val_acc >= target:
            return r.epoch
    return None



def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--intervals", default="10,50,200,1000,5000")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seeds", default="0", help="comma-separated seeds; mean ± sd over them")
    a = p.parse_args()
    specs = ["allreduce"] + [f"{m}:interval={n}" for n in a.intervals.split(",") for m in ("codistill", "afsd")]
    with tempfile.TemporaryDirectory() as out:
        rows = run_compare(["--methods", ",".join(specs), "--workers", "2", "--epochs", str(a.epochs),
                            "--seeds", a.seeds], out)
        by: dict[str, list[dict]] = {}
        for r in rows:
            by.setdefault(r["label"], []).append(r)
        target = statistics.mean(float(r["val_acc"]) for r in by["allreduce"])
        print(f"MNIST-1D, cnn1d, 2 models (data `same`), {a.epochs} epochs, seeds {a.seeds}, {os.cpu_count()} cores, "
              f"commit {commit()}; target = Allreduce (K=2) mean final validation accuracy {target:.4f}\n")
        print("| method | interval N | epoch at target (seeds reaching it) | val acc | test acc | sent/worker MB | "
              "train s |")
        print("|---|---|---|---|---|---|---|")
        for label, rs in by.items():
            bad = [r["status"] for r in rs if r["status"] != "ok"]
            n = label.split("=")[1] if "=" in label else "-"
            if bad:
                print(f"| {rs[0]['method']} | {n} | {', '.join(bad)} | | | | |")
                continue
            hits = [e for e in (earliest(r["run_dir"], target) for r in rs) if e is not None]
            at = f"{statistics.mean(hits):.1f} ({len(hits)}/{len(rs)})" if hits else f"never (0/{len(rs)})"
            print(f"| {rs[0]['method']} | {n} | {at} | {mean_sd([float(r['val_acc']) for r in rs])} | "
                  f"{mean_sd([float(r['final_acc']) for r in rs])} | "
                  f"{statistics.mean(float(r['bytes_sent_per_worker']) for r in rs) / 1e6:.2f} | "
                  f"{statistics.mean(float(r['train_s']) for r in rs):.1f} |")


if __name__ == "__main__":
    main()
