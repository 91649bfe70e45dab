"""Codistillation and AFSD: the checkpoint store against the prediction server, over intervals and two workloads.

For each workload, one `lowband compare` of every setting over the seeds, 4 workers in 2 models of 2
ranks (group_size 2: each model's two ranks allreduce gradients, which both exchanges pay alike):
  cnn1d: MNIST-1D, the quick suite's settings (SGD at its scaled rule), accuracy
  gpt:   the lm suite's workload (GPT tiny, 220,544 parameters at context 64, first 1 MB of the KJV text, context 64,
         batch 16, AdamW 0.003), validation bits per byte
Per setting it prints the mean ± sd final validation figure, the exchange's bytes per worker (the store:
checkpoints written and read, tag `ckpt`; the server: requests and answers, tags `predictions` and
`served`) and all bytes per worker, the seconds a 10 mbit/s link needs to carry each worker's exchange
bytes, and the measured training seconds (4 workers sharing the cores). Then, per workload, from the
measured bytes: a checkpoint's size, the bytes a server exchange costs per step, and the interval N*
below which the server sends fewer bytes than the store (the store's bytes fall as 1/N, the server's do
not depend on N).

Run: python benchmarks/distill_exchange.py [--seeds 0,1,2] [--workloads cnn1d,gpt] [--intervals 10,50] [--epochs N]
About 15 minutes on 2 cores with the defaults.
"""

import argparse
import csv
import glob
import os
import statistics
import subprocess
import sys
import tempfile

from common import commit, mean_sd
from lowband.run.metrics import read_metrics

EXCHANGE_TAGS = ("ckpt", "predictions", "served")
WORKLOADS = {  # name: (compare arguments, epochs, the validation figure's key)
    "cnn1d": (["--suite", "quick", "--workers", "4"], 10, "val_acc"),
    "gpt": (["--suite", "lm"], 2, "val_bpb"),
}


def specs(workload: str, intervals: list[int]) -> list[str]:
    """The settings run on a workload: both methods, both exchanges, each interval; on the GPT also the
    server answering only each position's 8 largest logits in fp16."""
    out = []
    for method in ("codistill", "afsd"):
        for n in intervals:
            out += [f"{method}:group_size=2:interval={n}", f"{method}:group_size=2:interval={n}:exchange=server"]
    if workload == "gpt":
        out += [f"codistill:group_size=2:interval={n}:exchange=server:answer_topk=8:codec=fp16" for n in intervals]
    return out


def compare(workload: str, args, out: str) -> str:
    base, epochs, _ = WORKLOADS[workload]
    epochs = args.epochs or epochs
    command = [sys.executable, "-m", "lowband", "compare", *base, "--methods", ",".join(specs(workload, args.intervals)),
               "--seeds", args.seeds, "--epochs", str(epochs), "--out", out, "-q"]
    print("$ lowband " + " ".join(command[3:]), flush=True)
    subprocess.run(command, check=False)
    return max(glob.glob(os.path.join(out, "compare-*")), key=os.path.getmtime)


def exchange_bytes(run_dir: str) -> float:
    """Mean bytes per worker sent by the exchange (store or server) over the whole run."""
    last = read_metrics(run_dir)[-1]
    return sum(v.get("sent", 0.0) for tag, v in last.bytes.items() if tag in EXCHANGE_TAGS)


def report(workload: str, folder: str, args) -> None:
    _, epochs, key = WORKLOADS[workload]
    epochs = args.epochs or epochs
    with open(os.path.join(folder, "summary.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get(key)]
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    print(f"\n{workload}: {epochs} epochs, 4 workers in 2 models; comparison directory {folder}\n")
    print(f"| setting | {key} (mean ± sd) | exchange MB/worker | all MB/worker | exchange s at 10 mbit/s | train s |")
    print("|---|---|---|---|---|---|")
    per_step: dict[str, float] = {}
    for label, runs in by.items():
        ex = statistics.mean(exchange_bytes(r["run_dir"]) for r in runs)
        sent = statistics.mean(float(r["bytes_sent_per_worker"]) for r in runs)
        train = statistics.mean(float(r["train_s"]) for r in runs)
        print(f"| {label} | {mean_sd([float(r[key]) for r in runs])} | {ex / 1e6:.3f} | {sent / 1e6:.3f} | "
              f"{ex * 8 / 10e6:.1f} | {train:.1f} |")
        steps = float(read_metrics(runs[0]["run_dir"])[-1].steps or 0)
        per_step[label] = ex / steps if steps else 0.0
    crossover(per_step)


def crossover(per_step: dict[str, float]) -> None:
    """From the measured bytes per step: the interval below which each server setting sends fewer bytes."""
    for label, cost in per_step.items():
        if ":exchange=server" not in label or not cost:
            continue
        store = label.replace(":exchange=server", "").split(":answer_topk")[0]
        interval = int(store.split("interval=")[1].split(":")[0])
        if store in per_step:
            checkpoint = per_step[store] * interval  # the store's bytes per worker per exchange
            print(f"{label}: {cost / 1e3:.1f} kB per step; the store's {store} {checkpoint / 1e3:.1f} kB per "
                  f"exchange; the server sends fewer bytes when the interval is below {checkpoint / cost:.1f} steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--workloads", default="cnn1d,gpt")
    p.add_argument("--intervals", default="10,50", type=lambda s: [int(v) for v in s.split(",")])
    p.add_argument("--epochs", type=int, default=0, help="epochs on every workload (default: cnn1d 10, gpt 2)")
    p.add_argument("--out", default=None, help="where the comparisons go (default: a temporary directory)")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="distill_exchange_")
    print(f"commit {commit()}")
    for workload in args.workloads.split(","):
        folder = compare(workload, args, os.path.join(out, workload))
        report(workload, folder, args)


if __name__ == "__main__":
    main()
