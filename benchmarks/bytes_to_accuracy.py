"""Bytes to Allreduce's accuracy: how few bytes per worker each low-communication setting needs.

Runs Allreduce and settings of local_sgd and diloco (with codecs and fragments) on MNIST-1D / cnn1d
with the same step budget and seeds, each with its own learning rate (given per setting below,
chosen by short sweeps recorded in benchmarks/history/JOURNAL.md). Prints per setting: mean ± sd of the final
validation and test accuracy, bytes sent per worker, and Allreduce's bytes divided by the
setting's ("ratio"), marked "yes" where the mean validation accuracy is within 0.5 points of
Allreduce's mean (the goal: a ratio of 1000 or more with "yes").

Run: python benchmarks/bytes_to_accuracy.py [--seeds 0,1,2] [--epochs 40] [--only LABEL,LABEL]
Each run is one `lowband compare` call; a run takes about a minute on 2 cores.
"""

import argparse
import os
import statistics
import tempfile

from common import commit, mean_sd, run_compare

# label, method spec, extra options. Inner lr: the default 0.05 base, x4 workers for methods that
# average workers (the default rule); diloco's inner rate is not scaled (its outer step does the rest).
SETTINGS = [
    ("allreduce", "allreduce", []),
    ("allreduce lr=0.1", "allreduce", ["--lr", "0.1"]),
    ("local_sgd tau=16", "local_sgd:tau=16", []),
    ("local_sgd tau=16 topk:0.1+int4", "local_sgd:tau=16:codec=topk:0.1+int4", []),
    ("local_sgd tau=16 int4", "local_sgd:tau=16:codec=int4", []),
    ("diloco tau=16", "diloco:tau=16", []),
    ("diloco tau=16 fragments=4", "diloco:tau=16:fragments=4", []),
    ("local_sgd tau=64 int4", "local_sgd:tau=64:codec=int4", []),
    ("local_sgd tau=16 topk:0.02+int2", "local_sgd:tau=16:codec=topk:0.02+int2", []),
    ("diloco tau=64", "diloco:tau=64", []),
    ("local_sgd tau=12", "local_sgd:tau=12", []),
    ("diloco tau=12", "diloco:tau=12", []),
    ("local_sgd tau=16 lr=0.025", "local_sgd:tau=16", ["--lr", "0.025"]),
    ("local_sgd tau=16 lr=0.035", "local_sgd:tau=16", ["--lr", "0.035"]),
    ("diloco tau=16 lr=0.035", "diloco:tau=16", ["--lr", "0.035"]),
]



def run_all(settings, seeds, epochs, workers, out) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for seed in seeds:
        for label, spec, extra in settings:
            got = run_compare(["--methods", spec, "--seed", str(seed), "--epochs", str(epochs), "--workers",
                               str(workers), "--dataset", "mnist1d", "--model", "cnn1d", *extra], out)
            r = got[0]
            rows.setdefault(label, []).append(r)
            print(f"seed {seed}  {label:<36} val {float(r['val_acc']):.4f}  test {float(r['final_acc']):.4f}  "
                  f"{float(r['bytes_sent_per_worker']) / 1e6:.4f} MB  {r['status']}", flush=True)
    return rows


def report(rows: dict[str, list[dict]], args) -> None:
    base = rows.get("allreduce")
    ref_val = statistics.mean(float(r["val_acc"]) for r in base) if base else float("nan")
    ref_bytes = statistics.mean(float(r["bytes_sent_per_worker"]) for r in base) if base else float("nan")
    print(f"\nMNIST-1D, cnn1d, {args.epochs} epochs, {args.workers} workers, seeds {args.seeds}, "
          f"{os.cpu_count()} cores, commit {commit()}")
    print(f"{'setting':<36} {'val acc':>17} {'test acc':>17} {'sent/worker':>12} {'ratio':>8} {'within 0.5pt':>12}")
    for label, rs in rows.items():
        val = [float(r["val_acc"]) for r in rs]
        sent = statistics.mean(float(r["bytes_sent_per_worker"]) for r in rs)
        ratio = ref_bytes / sent if sent else float("inf")
        near = "yes" if statistics.mean(val) >= ref_val - 0.005 else "no"
        print(f"{label:<36} {mean_sd(val):>17} {mean_sd([float(r['final_acc']) for r in rs]):>17} "
              f"{sent / 1e6:>9.4f} MB {ratio:>8.0f} {near:>12}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--only", help="comma-separated labels to run (allreduce is always run)")
    args = p.parse_args()
    settings = SETTINGS
    if args.only:
        wanted = {"allreduce", *args.only.split(",")}
        settings = [s for s in SETTINGS if s[0] in wanted]
    with tempfile.TemporaryDirectory() as out:
        rows = run_all(settings, [int(s) for s in args.seeds.split(",")], args.epochs, args.workers, out)
    report(rows, args)


if __name__ == "__main__":
    main()
