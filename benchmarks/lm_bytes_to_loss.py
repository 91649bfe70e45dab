"""Bytes to Allreduce's loss on a language model: how few bytes per worker DiLoCo-style settings need.

Runs, in one `lowband compare` on the lm suite's workload (byte-level GPT "tiny", 220,544 parameters at context 64,
on the first 1 MB of the KJV text, context 64, batch 16, 4 workers, AdamW with warm-up and cosine):
Allreduce and settings of local SGD and DiLoCo (codecs, fragments), each tuned on validation loss at
the run's own length (`--tune optim.lr=...` with `--tune-epochs` = the run's epochs, first seed), then
every setting on every seed. Prints per setting: mean ± sd of the final validation bits per byte,
the gap to Allreduce's mean in percent, bytes sent per worker, Allreduce's bytes over the setting's
("ratio"), whether the setting's mean final loss is within 1% of Allreduce's, and the ratio at equal
loss (Allreduce's bytes to its own final loss over the setting's bytes until its mean curve first
came within 1% of it; "-" when it never did). Goal: a ratio of 1000 or more within 1%.

Then, per setting, the mean validation bits per byte after each epoch, the last epochs' training loss and
the outer steps taken, which say why a setting fell short. `--from DIR` reports an earlier comparison again.

Run: python benchmarks/lm_bytes_to_loss.py [--seeds 0,1,2] [--epochs 4] [--lrs 0.002,0.004] [--only LABEL,...]
About a minute per run on 2 cores (4 workers); the default is 5 settings x (2 tuning + 3 seeds).
"""

import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import commit, mean_sd

SETTINGS = [  # label, method spec
    ("allreduce", "allreduce"),
    ("local_sgd tau=16", "local_sgd:tau=16"),
    ("diloco tau=16", "diloco:tau=16"),
    ("diloco tau=64 int4", "diloco:tau=64:codec=int4"),
    ("diloco tau=128 int2", "diloco:tau=128:codec=int2"),
]
MARGIN = 0.01


def compare(specs: list[str], args, out: str) -> str:
    """One `lowband compare` of every spec over the seeds, tuned; returns the comparison directory."""
    command = [sys.executable, "-m", "lowband", "compare", "--suite", "lm", "--methods", ",".join(specs),
               "--seeds", args.seeds, "--epochs", str(args.epochs), "--tune", f"optim.lr={args.lrs}",
               "--tune-epochs", str(args.epochs), "--out", out, "-q"]
    print("$ lowband " + " ".join(command[3:]), flush=True)
    subprocess.run(command, check=False)
    return max(glob.glob(os.path.join(out, "compare-*")), key=os.path.getmtime)


def records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def bytes_within(runs: list[dict], target: float) -> float | None:
    """Mean bytes per worker at the first epoch whose mean val_bpb over the seeds is within MARGIN of `target`."""
    curves = [records(r["run_dir"]) for r in runs]
    epochs = min(len(c) for c in curves)
    for e in range(epochs):
        if statistics.mean(c[e]["val_bpb"] for c in curves) <= target * (1 + MARGIN):
            return statistics.mean(c[e]["bytes_sent_per_worker"] for c in curves)
    return None


def report(folder: str, labels: dict[str, str], args) -> None:
    with open(os.path.join(folder, "summary.csv")) as f:
        rows = list(csv.DictReader(f))
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    ref = by["allreduce"]
    ref_bpb = statistics.mean(float(r["val_bpb"]) for r in ref)
    ref_bytes = statistics.mean(float(r["bytes_sent_per_worker"]) for r in ref)
    tuned = {r["label"]: r["tuned"] for r in rows}
    print(f"\nGPT tiny (220,544 parameters), KJV first 1 MB, context 64, batch 16, 4 workers, {args.epochs} epochs, "
          f"seeds {args.seeds}, lr tuned over {args.lrs} (validation loss, full length); "
          + (f"reported again at commit {commit()}" if args.source else f"commit {commit()}"))
    print(f"comparison directory: {folder}\n")
    print("| setting | lr | val bpb (mean ± sd) | vs allreduce | MB sent/worker | ratio | within 1% | ratio at equal loss |")
    print("|---|---|---|---|---|---|---|---|")
    for spec, runs in by.items():
        bpb = [float(r["val_bpb"]) for r in runs]
        sent = statistics.mean(float(r["bytes_sent_per_worker"]) for r in runs)
        gap = 100 * (statistics.mean(bpb) / ref_bpb - 1)
        within = statistics.mean(bpb) <= ref_bpb * (1 + MARGIN)
        at = bytes_within(runs, ref_bpb)
        ratio = "-" if not sent else f"{ref_bytes / sent:,.0f}"
        equal = "-" if at is None or not at else f"{ref_bytes / at:,.0f}"
        print(f"| {labels.get(spec, spec)} | {tuned.get(spec, '').split('=')[-1]} | {mean_sd(bpb)} | {gap:+.2f}% | "
              f"{sent / 1e6:.3f} | {ratio} | {'yes' if within else 'no'} | {equal} |")


def curves(folder: str, labels: dict[str, str]) -> None:
    """Per setting, the mean over seeds of validation bits per byte after each epoch, the workers' mean
    training loss in the last two epochs (nats), and the outer steps taken (steps a worker / tau)."""
    with open(os.path.join(folder, "summary.csv")) as f:
        by: dict[str, list[dict]] = {}
        for r in csv.DictReader(f):
            by.setdefault(r["label"], []).append(r)
    print("\nMean over seeds after each epoch: validation bits per byte; training loss (nats) in the last two epochs\n")
    for spec, runs in by.items():
        recs = [records(r["run_dir"]) for r in runs]
        epochs = min(len(c) for c in recs)
        bpb = [statistics.mean(c[e]["val_bpb"] for c in recs) for e in range(epochs)]
        train = [statistics.mean(c[e]["train_loss"] for c in recs) for e in range(max(epochs - 2, 0), epochs)]
        tau = next((int(o.split("=")[1]) for o in spec.split(":")[1:] if o.startswith("tau=")), None)
        outer = f"; {recs[0][epochs - 1]['steps'] // tau} outer steps" if tau else ""
        print(f"{labels.get(spec, spec)}: val bpb {' '.join(f'{v:.3f}' for v in bpb)}; "
              f"train loss {' -> '.join(f'{v:.3f}' for v in train)}{outer}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lrs", default="0.002,0.004", help="the inner learning rates each setting is tuned over")
    p.add_argument("--only", help="comma-separated labels (allreduce is always run)")
    p.add_argument("--out", default=None, help="where the comparison goes (default: a temporary directory)")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="report an earlier run of this script's comparison directory instead of running again")
    args = p.parse_args()
    settings = [s for s in SETTINGS if not args.only or s[0] == "allreduce" or s[0] in args.only.split(",")]
    folder = args.source or compare([spec for _, spec in settings], args, args.out or tempfile.mkdtemp(prefix="lm_bytes_"))
    labels = {spec: label for label, spec in settings}
    report(folder, labels, args)
    curves(folder, labels)


if __name__ == "__main__":
    main()
