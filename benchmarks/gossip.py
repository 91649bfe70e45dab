"""Convergence of D-PSGD, RD-PSGD and TopK gossip on MNIST-1D (cnn1d), K = 8 on a ring.

Runs through `lowband compare`: D-PSGD (= RD-PSGD at p = 1), RD-PSGD at p in {0.5, 0.1, 0.01}
(seed indices) and TopK at the same p, and prints final accuracy of the averaged model, the
best local model, and bytes per worker (values and indices). The RD-PSGD paper (Figs. 3-5)
claims no accuracy loss down to p = 0.1.

Run: python benchmarks/gossip.py [--workers 8] [--epochs 30] [--ps 0.5,0.1,0.01]
"""

import argparse
import os
import tempfile

from common import run_compare
from lowband.metrics import read_metrics


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--ps", default="0.5,0.1,0.01")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    ps = a.ps.split(",")
    specs = ["dpsgd"] + [f"rdpsgd:p={x}" for x in ps] + [f"topk:p={x}" for x in ps]
    with tempfile.TemporaryDirectory() as out:
        rows = run_compare(["--methods", ",".join(specs), "--workers", str(a.workers), "--epochs", str(a.epochs),
                            "--seed", str(a.seed)], out)
        print(f"MNIST-1D, cnn1d, K = {a.workers} ring, {a.epochs} epochs, seed {a.seed}, {os.cpu_count()} cores\n")
        print("| method | p | final acc (average model) | best local acc | sent/worker MB | of which index MB | "
              "train s | comm s |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            if r["status"] != "ok":
                print(f"| {r['label']} | - | {r['status']} | | | | | |")
                continue
            last = read_metrics(r["run_dir"])[-1]
            index = last["bytes"].get("index", {}).get("sent", 0.0) / 1e6
            comm = sum(x["time"]["comm_s"] for x in read_metrics(r["run_dir"]))
            frac = r["label"].split("=")[1] if "=" in r["label"] else "1"
            print(f"| {r['method']} | {frac} | {float(r['final_acc']):.4f} | {float(r['final_acc_L']):.4f} | "
                  f"{float(r['bytes_sent_per_worker']) / 1e6:.3f} | {index:.3f} | {float(r['train_s']):.1f} | "
                  f"{comm:.1f} |")


if __name__ == "__main__":
    main()
