"""Final test accuracy of methods on MNIST-1D with cnn1d, over several seeds, via `lowband compare`.

Run: python benchmarks/accuracy.py [--methods single,allreduce] [--seeds 0,1,2] [--epochs 30] [--workers 4]
Prints one row per method: mean and standard deviation of final accuracy, bytes per worker, time.
"""

import argparse
import os
import statistics
import tempfile

from common import run_compare


def run_seed(methods: str, seed: int, epochs: int, workers: int, extra: list[str], out: str) -> list[dict]:
    return run_compare(["--methods", methods, "--seed", str(seed), "--epochs", str(epochs), "--workers", str(workers),
                        "--dataset", "mnist1d", "--model", "cnn1d", *extra], out)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--methods", default="single,allreduce")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--set", dest="sets", action="append", default=[])
    a = p.parse_args()
    extra = [x for s in a.sets for x in ("--set", s)]
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as out:
        for seed in map(int, a.seeds.split(",")):
            for r in run_seed(a.methods, seed, a.epochs, a.workers, extra, out):
                rows.setdefault(r["method"], []).append(r)
                print(f"seed {seed}  {r['method']:<12} final acc {float(r['final_acc']):.4f}", flush=True)
    print(f"\nMNIST-1D, cnn1d, {a.epochs} epochs, {a.workers} workers, seeds {a.seeds}, {os.cpu_count()} cores")
    print(f"{'method':<12} {'workers':>7} {'final acc mean':>15} {'sd':>7} {'sent/worker MB':>15} {'train s':>8}")
    for method, rs in rows.items():
        accs = [float(r["final_acc"]) for r in rs]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        mb = statistics.mean(float(r["bytes_sent_per_worker"]) for r in rs) / 1e6
        secs = statistics.mean(float(r["train_s"]) for r in rs)
        print(f"{method:<12} {rs[0]['workers']:>7} {statistics.mean(accs):>15.4f} {sd:>7.4f} {mb:>15.2f} {secs:>8.1f}")


if __name__ == "__main__":
    main()
