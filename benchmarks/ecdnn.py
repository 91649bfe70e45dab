"""EC-DNN paper's Table 2 on MNIST-1D (cnn1d): test error and speed of MA-DNN, E-DNN, EC-DNN-S/R/M, S-DNN.

For each K it runs, through `lowband compare`: MA-DNN with tau in {1, 16, 256}, E-DNN, EC-DNN with
simple, regression and margin ensembles, and S-DNN, all with the same data, model, seed and epochs.
MA-DNN_G is the MA-DNN run with the best final validation accuracy; speed = the training time
MA-DNN_G needed to reach its final validation accuracy / the time the method needed (0: never).
Test error is reported beside validation error; with --seeds, mean ± sd. Also prints the
Diff_LG distribution (mean local error - global error, per round) of model averaging and ensembles.

Run: python benchmarks/ecdnn.py [--workers 4,8] [--epochs 30] [--seeds 0,1,2] [--ensemble-lr 0.2]
"""

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from common import commit, mean_sd, run_compare
from lowband.comparison.runner import time_to
from lowband.run.metrics import read_metrics

MA = ["local_sgd:tau=1", "local_sgd:tau=16", "local_sgd:tau=256"]
OTHERS = ["ensemble", "ec_dnn:ensemble=simple", "ec_dnn:ensemble=regression", "ec_dnn:ensemble=margin", "single"]
NAMES = {"ensemble": "E-DNN", "ec_dnn:ensemble=simple": "EC-DNN-S", "ec_dnn:ensemble=regression": "EC-DNN-R",
         "ec_dnn:ensemble=margin": "EC-DNN-M", "single": "S-DNN"}


def run(workers: int, epochs: int, seeds: str, out: str, ensemble_lr: float | None = None) -> list[dict]:
    common = ["--workers", str(workers), "--epochs", str(epochs), "--seeds", seeds]
    if ensemble_lr is None:
        rows = run_compare(["--methods", ",".join(MA + OTHERS), *common], out)
    else:  # the ensembles (unscaled: they do not average workers) at their own rate
        rows = run_compare(["--methods", ",".join(MA + OTHERS[4:]), *common], out)
        rows += run_compare(["--methods", ",".join(OTHERS[:4]), *common, "--lr", str(ensemble_lr)], out)
    for r in rows:
        r["records"] = [x for x in read_metrics(r["run_dir"]) if x.test_acc is not None]
        path = os.path.join(r["run_dir"], "rounds.jsonl")
        r["rounds"] = [json.loads(line) for line in Path(path).read_text().splitlines()] if os.path.exists(path) else []
    return rows


def speed(records, key: str, target: float, t_ref: float) -> float:
    t = time_to(records, key, target)
    return 0.0 if t is None else t_ref / max(t, 1e-9)


def seed_lines(rows: list[dict]) -> list[tuple[str, dict, str, str]]:
    """One seed's table lines (name, row, accuracy key, tau). MA-DNN_G is the tau whose final
    *validation* accuracy is best; speed and the target use its validation curve too."""
    ma = max((r for r in rows if r["label"] in MA), key=lambda r: float(r["val_acc"]))
    tau = ma["label"].split("=")[1]
    lines = [("MA-DNN_G", ma, "", tau)]
    lines += [(f"{NAMES[r['label']]}_G", r, "", "64" if "ec_dnn" in r["label"] else "-")
              for r in rows if r["label"] in OTHERS[:4]]
    lines += [("MA-DNN_L", ma, "_L", tau)]
    lines += [(f"{NAMES[r['label']]}_L", r, "_L", "64" if "ec_dnn" in r["label"] else "-")
              for r in rows if r["label"] in OTHERS[:4]]
    lines += [("S-DNN", next(r for r in rows if r["label"] == "single"), "", "-")]
    return lines


def table(rows: list[dict], workers: int) -> None:
    by_seed: dict[str, list[dict]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r)
    figures: dict[str, dict[str, list]] = {}
    taus = []
    for seed_rows in by_seed.values():
        lines = seed_lines(seed_rows)
        ma = lines[0][1]
        target = ma["records"][-1].val_acc
        t_ref = time_to(ma["records"], "val_acc", target)
        taus.append(lines[0][3])
        for name, r, suffix, tau in lines:
            last = r["records"][-1]
            f = figures.setdefault(name, {"val": [], "test": [], "speed": [], "mb": [], "s": [], "tau": tau})
            f["val"].append(1 - last.value("val_acc" + suffix))
            f["test"].append(1 - last.value("test_acc" + suffix))
            f["speed"].append(speed(r["records"], "val_acc" + suffix, target, t_ref))
            f["mb"].append(float(r["bytes_sent_per_worker"]) / 1e6)
            f["s"].append(float(r["train_s"]))
    print(f"\n### K = {workers}  (MA-DNN_G per seed, by validation accuracy: tau = {', '.join(taus)})\n")
    print("| model | val error % | test error % | speed | tau | sent/worker MB | train s |")
    print("|---|---|---|---|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {mean_sd(f['val'], 100, 2)} | {mean_sd(f['test'], 100, 2)} | {mean_sd(f['speed'], digits=2)} | "
              f"{f['tau'] if name != 'MA-DNN_G' and name != 'MA-DNN_L' else '/'.join(taus)} | "
              f"{statistics.mean(f['mb']):.3f} | {statistics.mean(f['s']):.1f} |")
    for label in MA:
        accs = [float(r["val_acc"]) for r in rows if r["label"] == label]
        mb = statistics.mean(float(r["bytes_sent_per_worker"]) for r in rows if r["label"] == label) / 1e6
        print(f"{label}: val acc {mean_sd(accs, digits=2)}, {mb:.2f} MB")


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
    p.add_argument("--seeds", default="0", help="comma-separated seeds; the tables show mean ± sd over them")
    p.add_argument("--ensemble-lr", type=float, help="learning rate of E-DNN and EC-DNN (default: the 0.05 default)")
    a = p.parse_args()
    print(f"MNIST-1D, cnn1d, {a.epochs} epochs, seeds {a.seeds}, {os.cpu_count()} cores, commit {commit()}; "
          f"ensemble lr {a.ensemble_lr or 0.05}; defaults otherwise (lr rule: 0.05, x K with warm-up for model "
          f"averaging; batch 32; "
          f"EC-DNN alpha 0.6 beta 0.4 p 0.1 mu 0.7 tau 64)")
    everything = []
    with tempfile.TemporaryDirectory() as out:
        for k in map(int, a.workers.split(",")):
            rows = run(k, a.epochs, a.seeds, out, a.ensemble_lr)
            table(rows, k)
            everything += rows
        diff_lg(everything)


if __name__ == "__main__":
    main()
