"""AFSD paper's Tables 1-2 on MNIST-1D (cnn1d): 2 models on the same data, interval sweep.

Runs Allreduce (K = 2) first; its final accuracy is the target. Then codistillation and AFSD
(2 models, data `same`) for each update interval, and prints the earliest epoch at which each
reaches the target, its final accuracy and the bytes each worker sent (checkpoints for
codistillation/AFSD, gradients for Allreduce).

Run: python benchmarks/afsd.py [--intervals 10,50,200,1000,5000] [--epochs 30] [--seed 0]
"""

import argparse
import os
import tempfile

from common import run_compare
from lowband.metrics import read_metrics


def compare(specs: list[str], epochs: int, seed: int, out: str, extra: list[str]) -> list[dict]:
    return run_compare(["--methods", ",".join(specs), "--workers", "2", "--epochs", str(epochs), "--seed", str(seed),
                        *extra], out)


def earliest(run_dir: str, target: float) -> str:
    for r in read_metrics(run_dir):
        if r.get("test_acc") is not None and r["test_acc"] >= target:
            return str(r["epoch"])
    return "never"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--intervals", default="10,50,200,1000,5000")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        (base,) = compare(["allreduce"], a.epochs, a.seed, out, [])
        target = float(base["final_acc"])
        specs = [f"{m}:interval={n}" for n in a.intervals.split(",") for m in ("codistill", "afsd")]
        rows = compare(specs, a.epochs, a.seed, out, ["--set", f"train.target_accuracy={target}"])
        print(f"MNIST-1D, cnn1d, 2 models (data `same`), {a.epochs} epochs, seed {a.seed}, {os.cpu_count()} cores; "
              f"target = Allreduce (K=2) final accuracy {target:.4f}\n")
        print("| method | interval N | earliest epoch at target | final acc | sent/worker MB | train s |")
        print("|---|---|---|---|---|---|")
        print(f"| allreduce | - | {earliest(base['run_dir'], target)} | {target:.4f} | "
              f"{float(base['bytes_sent_per_worker']) / 1e6:.2f} | {float(base['train_s']):.1f} |")
        for r in rows:
            n = r["label"].split("=")[1]
            print(f"| {r['method']} | {n} | {earliest(r['run_dir'], target)} | {float(r['final_acc']):.4f} | "
                  f"{float(r['bytes_sent_per_worker']) / 1e6:.2f} | {float(r['train_s']):.1f} |")


if __name__ == "__main__":
    main()
