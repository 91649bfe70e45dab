"""EC-DNN paper's Table 2 on MNIST-1D (cnn1d): test error and speed of MA-DNN, E-DNN, EC-DNN-S/R/M, S-DNN.

For each K it runs, through `lowband compare`: MA-DNN with tau in {1, 16, 256}, E-DNN, EC-DNN with
simple, regression and margin ensembles, and S-DNN, all with the same data, model, seed and epochs.
MA-DNN_G is the MA-DNN run with the best final global accuracy; speed = the training time MA-DNN_G
needed to reach its final accuracy / the time the method needed (0: never). Also prints the
Diff_LG distribution (mean local error - global error, per round) of model averaging and ensembles.

Run: python benchmarks/ecdnn.py [--workers 4,8] [--epochs 30] [--seed 0]
"""

import argparse
import json
import os
import tempfile

from common import run_compare
from lowband.compare import time_to
from lowband.metrics import read_metrics

MA = ["local_sgd:tau=1", "local_sgd:tau=16", "local_sgd:tau=256"]
OTHERS = ["ensemble", "ec_dnn:ensemble=simple", "ec_dnn:ensemble=regression", "ec_dnn:ensemble=margin", "single"]
NAMES = {"ensemble": "E-DNN", "ec_dnn:ensemble=simple": "EC-DNN-S", "ec_dnn:ensemble=regression": "EC-DNN-R",
         "ec_dnn:ensemble=margin": "EC-DNN-M", "single": "S-DNN"}


def run(workers: int, epochs: int, seed: int, out: str) -> list[dict]:
    rows = run_compare(["--methods", ",".join(MA + OTHERS), "--workers", str(workers), "--epochs", str(epochs),
                        "--seed", str(seed)], out)
    for r in rows:
        r["records"] = [x for x in read_metrics(r["run_dir"]) if x.get("test_acc") is not None]
        path = os.path.join(r["run_dir"], "rounds.jsonl")
        r["rounds"] = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    return rows


def speed(records, key: str, target: float, t_ref: float) -> float:
    t = time_to(records, key, target)
    return 0.0 if t is None else t_ref / max(t, 1e-9)


def table(rows: list[dict], workers: int) -> None:
    ma = max((r for r in rows if r["label"] in MA), key=lambda r: float(r["final_acc"]))
    target = float(ma["final_acc"])
    t_ref = time_to(ma["records"], "test_acc", target)
    tau = ma["label"].split("=")[1]
    print(f"\n### K = {workers}  (MA-DNN_G: tau = {tau}, final accuracy {target:.4f})\n")
    print("| model | test error % | speed | tau | sent/worker MB | train s |")
    print("|---|---|---|---|---|---|")
    lines = [("MA-DNN_G", ma, "test_acc", tau)]
    lines += [(f"{NAMES[r['label']]}_G", r, "test_acc", "64" if "ec_dnn" in r["label"] else "-")
              for r in rows if r["label"] in OTHERS[:4]]
    lines += [("MA-DNN_L", ma, "test_acc_L", tau)]
    lines += [(f"{NAMES[r['label']]}_L", r, "test_acc_L", "64" if "ec_dnn" in r["label"] else "-")
              for r in rows if r["label"] in OTHERS[:4]]
    lines += [("S-DNN", next(r for r in rows if r["label"] == "single"), "test_acc", "-")]
    for name, r, key, t in lines:
        err = 100 * (1 - r["records"][-1][key])
        print(f"| {name} | {err:.2f} | {speed(r['records'], key, target, t_ref):.2f} | {t} | "
              f"{float(r['bytes_sent_per_worker']) / 1e6:.3f} | {float(r['train_s']):.1f} |")
    print("\nall MA-DNN runs: " + ", ".join(f"tau={r['label'].split('=')[1]}: acc {float(r['final_acc']):.4f}, "
                                           f"{float(r['bytes_sent_per_worker']) / 1e6:.2f} MB"
                                           for r in rows if r["label"] in MA))


def diff_lg(all_rows: list[dict]) -> None:
    print("\n### Diff_LG over all rounds (positive: the global model beats the mean local model)\n")
    print("| aggregation | rounds | share worse than mean local | mean Diff_LG (pp) | min (pp) | max (pp) |")
    print("|---|---|---|---|---|---|")
    groups = {"MA (parameter average)": [r for r in all_rows if r["label"] in MA],
              "simple ensemble (EC-DNN-S)": [r for r in all_rows if r["label"] == "ec_dnn:ensemble=simple"],
              "all ensembles (EC-DNN-S/R/M)": [r for r in all_rows if r["label"].startswith("ec_dnn")]}
    for name, rows in groups.items():
        d = [x["diff_lg"] for r in rows for x in r["rounds"]]
        if d:
            worse = sum(v < 0 for v in d) / len(d)
            print(f"| {name} | {len(d)} | {worse:.1%} | {100 * sum(d) / len(d):.2f} | {100 * min(d):.2f} | "
                  f"{100 * max(d):.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", default="4,8")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(f"MNIST-1D, cnn1d, {a.epochs} epochs, seed {a.seed}, {os.cpu_count()} cores; "
          f"defaults otherwise (lr 0.05 per worker, batch 32, EC-DNN alpha 0.6 beta 0.4 p 0.1 mu 0.7 tau 64)")
    everything = []
    with tempfile.TemporaryDirectory() as out:
        for k in map(int, a.workers.split(",")):
            rows = run(k, a.epochs, a.seed, out)
            table(rows, k)
            everything += rows
        diff_lg(everything)


if __name__ == "__main__":
    main()
