"""When an elastic DiLoCo job's quorum shrinks, should its outer step shrink with it? (issue 65)

Charles et al. 2025 (the DiLoCo scaling-law paper) find the best outer learning rate grows with the number of
replicas M; an elastic job keeps the rate chosen for the workers it launched, whoever is left. Two measures,
on the chaos soak's job (benchmarks/chaos.py: DiLoCo on 2,000 MNIST-1D samples, batch 16, tau 4, outer lr 0.7,
Nesterov momentum 0.9):

  fixed   plain runs: 3 workers at outer lr 0.7, 1 worker at 0.7, and 1 worker at 0.7 / 3 (what
          elastic.scale_with_quorum gives a round of one contributor in a job launched with 3)
  churn   elastic jobs of 3 workers, min_workers 1, two of them killed at round --kill-round, so the
          rest of the job is a quorum of one; elastic.scale_with_quorum=false (the mean over the
          round's contributors, as torchft's Manager takes it) against =true (the sum over the
          contributors divided by the workers launched: an absent worker counts as a zero
          pseudo-gradient, so the outer step shrinks with the quorum)

Each row: the validation loss at its best and at the end, the final accuracy (chance is 0.10), and the
epochs whose validation accuracy was at most 0.15 (at chance).

Run: python benchmarks/quorum_rates.py [--part fixed,churn] [--lrs 0.003,0.01] [--epochs 40] [--seeds 0]
     [--out runs/quorum_rates]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

from common import commit

COMMON = ["--set", "data.num_samples=2000", "--batch-size", "16", "--set", "method.tau=4", "-q"]
CHANCE_ACC = 0.15


def records(run: str) -> list[dict]:
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def row(name: str, run: str, code: int, took: float) -> str:
    recs = records(run)
    losses = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    if not losses:
        return f"| {name} | exit {code} | - | - | - | - | {took:.0f} s |"
    stalled = sum(1 for r in recs if (r.get("val_acc") or 0.0) <= CHANCE_ACC)
    return (f"| {name} | exit {code} | {min(losses):.4f} | {losses[-1]:.4f} | {recs[-1].get('val_acc', 0.0):.4f} | "
            f"{stalled} of {len(recs)} | {took:.0f} s |")


def train(run: str, args: list[str], env: dict | None = None) -> tuple[int, float]:
    shutil.rmtree(run, ignore_errors=True)
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "lowband", "train", *args, "--run-dir", run],
                       env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False)
    if p.returncode:
        print(f"  {run}: exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:200]}", flush=True)
    return p.returncode, time.time() - t0


def fixed(args, lr: float, seed: int) -> list[str]:
    out = []
    for workers, outer in ((3, 0.7), (1, 0.7), (1, 0.7 / 3)):
        name = f"fixed K={workers} outer lr {outer:.3g} (lr {lr:g}, seed {seed})"
        run = os.path.join(args.out, f"fixed-k{workers}-outer{outer:.3f}-lr{lr:g}-s{seed}")
        code, took = train(run, ["--method", "diloco", "--workers", str(workers), "--lr", str(lr), "--epochs",
                                 str(args.epochs), "--seed", str(seed), "--set", f"method.outer_lr={outer}", *COMMON])
        out.append(row(name, run, code, took))
        print(out[-1], flush=True)
    return out


def churn(args, lr: float, seed: int) -> list[str]:
    out = []
    kill = f"1:{args.kill_round}:inner:kill,2:{args.kill_round}:inner:kill"
    for follow in ("false", "true"):
        name = f"elastic 3 -> 1 at round {args.kill_round}, scale_with_quorum={follow} (lr {lr:g}, seed {seed})"
        run = os.path.join(args.out, f"churn-follow-{follow}-lr{lr:g}-s{seed}")
        code, took = train(run, ["--elastic", "--method", "diloco", "--workers", "3", "--lr", str(lr), "--epochs",
                                 str(args.epochs), "--seed", str(seed), "--set", "method.outer_lr=0.7",
                                 "--set", f"elastic.scale_with_quorum={follow}", "--set", "elastic.min_workers=1",
                                 "--set", "elastic.dead_after_s=2", "--set", "elastic.heartbeat_s=0.4",
                                 "--set", "elastic.timeout_s=10", *COMMON], env={"LOWBAND_ELASTIC_FAULT": kill})
        out.append(row(name, run, code, took))
        print(out[-1], flush=True)
    return out


def floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v]
    if not values or not all(math.isfinite(v) and 0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated rates in (0, 1]")
    return values


def bounded(lo: int, hi: int):
    def parse(text: str) -> int:
        value = int(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value}: must be in [{lo}, {hi}]")
        return value
    return parse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", default="fixed,churn", help="fixed, churn or both (comma-separated)")
    p.add_argument("--lrs", type=floats, default=[0.003, 0.01], help="inner rates, comma-separated")
    p.add_argument("--epochs", type=bounded(1, 1000), default=40)
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument("--kill-round", type=bounded(1, 100_000), default=10, help="the round two workers die in")
    p.add_argument("--out", default="runs/quorum_rates", help="where the runs go (replaced)")
    args = p.parse_args()
    parts = set(args.part.split(","))
    if not parts or parts - {"fixed", "churn"}:
        p.error(f"--part={args.part!r}: fixed, churn or fixed,churn")
    try:
        seeds = [bounded(0, 2**32 - 1)(s) for s in args.seeds.split(",")]
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(f"--seeds={args.seeds!r}: {e}")
    os.makedirs(args.out, exist_ok=True)
    print(f"commit {commit()}; {args.epochs} epochs\n")
    print("| run | exit | best val loss | final val loss | final val acc | epochs at chance | wall |\n"
          "|---|---|---|---|---|---|---|", flush=True)
    lines = []
    try:
        for lr in args.lrs:
            for seed in seeds:
                lines += fixed(args, lr, seed) if "fixed" in parts else []
                lines += churn(args, lr, seed) if "churn" in parts else []
    except KeyboardInterrupt:
        sys.exit("quorum_rates: interrupted")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
