"""Convergence of D-PSGD, RD-PSGD and TopK gossip on MNIST-1D (cnn1d), K = 8 on a ring.

Runs through `lowband compare`: D-PSGD (= RD-PSGD at p = 1), RD-PSGD at p in {0.5, 0.1, 0.01}
(seed indices) and TopK at the same p, and prints final accuracy of the averaged model, the
best local model, and bytes per worker (values and indices). The RD-PSGD paper (Figs. 3-5)
claims no accuracy loss down to p = 0.1.

Run: python benchmarks/gossip.py [--workers 8] [--epochs 30] [--ps 0.5,0.1,0.01] [--seeds 0,1,2]
"""

import argparse
import os
import statistics
import tempfile

from common import commit, mean_sd, run_compare
from lowband.run.metrics import read_metrics


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--ps", default="0.5,0.1,0.01")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; the table shows mean ± sd over them")
    p.add_argument("--unscaled", action="store_true", help="the per-worker rate, not x K (optim.lr_scaling='none')")
    a = p.parse_args()
    ps = a.ps.split(",")
    specs = ["dpsgd"] + [f"rdpsgd:p={x}" for x in ps] + [f"topk:p={x}" for x in ps]
    with tempfile.TemporaryDirectory() as out:
        rows = run_compare(["--methods", ",".join(specs), "--workers", str(a.workers), "--epochs", str(a.epochs),
                            "--seeds", a.seeds, *(["--set", "optim.lr_scaling='none'"] if a.unscaled else [])], out)
        by: dict[str, list[dict]] = {}
        for r in rows:
            by.setdefault(r["label"], []).append(r)
        print(f"MNIST-1D, cnn1d, K = {a.workers} ring, {a.epochs} epochs, seeds {a.seeds}, "
              f"lr {'unscaled' if a.unscaled else 'x K (the rule)'}, {os.cpu_count()} cores, commit {commit()}\n")
        print("| method | p | val acc (average model) | test acc (average model) | best local test acc | "
              "sent/worker MB | of which index MB | train s |")
        print("|---|---|---|---|---|---|---|---|")
        for label, rs in by.items():
            frac = label.split("=")[1] if "=" in label else "1"
            bad = [r["status"] for r in rs if r["status"] != "ok"]
            if bad:
                print(f"| {rs[0]['method']} | {frac} | {', '.join(bad)} | | | | | |")
                continue
            index = statistics.mean(read_metrics(r["run_dir"])[-1].bytes.get("index", {}).get("sent", 0.0)
                                    for r in rs) / 1e6
            print(f"| {rs[0]['method']} | {frac} | {mean_sd([float(r['val_acc']) for r in rs])} | "
                  f"{mean_sd([float(r['final_acc']) for r in rs])} | {mean_sd([float(r['final_acc_L']) for r in rs])} | "
                  f"{statistics.mean(float(r['bytes_sent_per_worker']) for r in rs) / 1e6:.3f} | {index:.3f} | "
                  f"{statistics.mean(float(r['train_s']) for r in rs):.1f} |")


if __name__ == "__main__":
    main()
