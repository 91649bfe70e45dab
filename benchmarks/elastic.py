"""Elastic DiLoCo or SparseLoCo under churn against the same job without it: what leaving and joining costs.

Workload: the lm suite's (byte-level GPT "tiny" on the first 1 MB of the KJV text, context 64, batch
16, AdamW with warm-up and cosine), `lowband train --elastic` on 4 workers, one method (--method):
DiLoCo tau 16 at lr 0.003, or SparseLoCo with the ladder's `tiny` setting (tau 8, 1/64 of each
4,096-chunk in 2-bit codes, outer lr 3, lr 0.016). The rounds' own evaluations are off
(`method.round_evals=0`; at the default, 100, they took 165 of an epoch's 210 s). Two schedules, each
on every seed:

  steady   4 workers from start to end
  churn    one worker is killed (SIGKILL) at 25% of the data, two join (`lowband join`) at 50%,
           one is killed at 75%: 4, 3, 5, 4 workers, a mean of about 4 over the data

Progress is the share of the job's samples handed out (quorums.jsonl). Printed per schedule: final
validation bits per byte (mean ± sd over seeds), wall time, rounds, mean workers per round, rounds
redone, bytes by tag over all workers, and the seconds lost per membership change (the change's
round took that much longer than the median round). The churned job is "within noise" when its
mean is within two standard deviations of the steady one's (both schedules' seed spread).

Run: python benchmarks/elastic.py [--method diloco|sparseloco] [--seeds 0,1,2] [--epochs 4] [--max-bytes 1000000]
About a minute per job on 2 cores.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise

from common import commit, mean_sd

WORKLOAD = ["--dataset", "text", "--model", "gpt", "--set", "model.size=tiny", "--set", "data.context=64",
            "--batch-size", "16", "--set", "optim.name=adamw", "--set", "optim.weight_decay=0.1",
            "--set", "optim.warmup_epochs=0.25", "--set", "optim.lr_scaling=none",
            "--set", "method.round_evals=0"]  # each round's own evaluation: 4/5 of an epoch's wall time, no training
METHODS = {
    "diloco": ["--method", "diloco", "--set", "method.tau=16", "--set", "optim.lr=0.003"],
    "sparseloco": ["--method", "sparseloco", "--set", "method.tau=8", "--set", "method.density=0.015625",
                   "--set", "method.codec=lut2", "--set", "method.outer_lr=3.0", "--set", "optim.lr=0.016"],
}
CHURN = [(0.25, "leave", 1), (0.50, "join", 2), (0.75, "leave", 1)]


def rounds(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "quorums.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def progress(run_dir: str, samples: int, epochs: int) -> float:
    """Share of the job's samples handed out so far."""
    recs = rounds(run_dir)
    if not recs:
        return 0.0
    last = recs[-1]
    cursor = max((end for _, end in last["slices"].values()), default=0)
    return (last["epoch"] - 1 + cursor / samples) / epochs


def training_samples(max_bytes: int) -> int:
    """Training windows of the workload (80% of the bytes, windows of 64 at stride 64)."""
    from lowband.data.text import kjv_bytes, split_blocks

    train, _, _ = split_blocks(kjv_bytes()[:max_bytes], 0.1)
    return (len(train) - 1) // 64


def kill_one(run_dir: str) -> None:
    """SIGKILL the live worker with the highest id (never the coordinator or the launcher)."""
    from lowband.comm.membership import Membership

    with open(os.path.join(run_dir, "elastic.json")) as f:
        job = json.load(f)
    live = Membership(job["coordinator"], job["job"]).members_info()
    victim = max(live, key=lambda m: m["id"])
    os.kill(victim["pid"], signal.SIGKILL)
    print(f"    killed worker {victim['id']} (pid {victim['pid']})", flush=True)


def job(seed: int, churn: bool, args, out: str) -> dict:
    run_dir = os.path.join(out, f"{'churn' if churn else 'steady'}-seed{seed}")
    command = [sys.executable, "-m", "lowband", "train", "--elastic", *WORKLOAD, *METHODS[args.method], "--workers", "4",
               "--epochs", str(args.epochs), "--seed", str(seed), "--set", f"data.max_bytes={args.max_bytes}",
               "--run-dir", run_dir, "-q"]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    joiners, plan = [], list(CHURN) if churn else []
    samples = training_samples(args.max_bytes)
    while proc.poll() is None:
        if plan and progress(run_dir, samples, args.epochs) >= plan[0][0]:
            at, what, count = plan.pop(0)
            print(f"  {at:.0%}: {what} {count}", flush=True)
            for _ in range(count):
                if what == "leave":
                    kill_one(run_dir)
                else:
                    joiners.append(subprocess.Popen([sys.executable, "-m", "lowband", "join", run_dir],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.2)
    wall = time.monotonic() - t0
    for j in joiners:
        j.wait(timeout=120)
    if proc.returncode != 0:
        print(f"  {run_dir}: exit {proc.returncode}: {proc.stderr.read()[-500:]}")
    return summarize(run_dir, wall)


def summarize(run_dir: str, wall: float) -> dict:
    recs = rounds(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in pairwise(recs)]
    typical = statistics.median(times)
    changes = [times[i] - typical for i in range(len(times)) if recs[i]["members"] != recs[i + 1]["members"]]
    return {"bpb": last["val_bpb"], "wall": wall, "rounds": len(recs),
            "workers": statistics.mean(len(r["members"]) for r in recs),
            "redone": sum(1 for r in recs if r["attempt"] > 0), "lost": changes,
            "bytes": {t: v["sent"] for t, v in last["bytes_total"].items()}, "run_dir": run_dir}


def report(name: str, results: list[dict]) -> None:
    tags = sorted({t for r in results for t in r["bytes"]})
    lost = [x for r in results for x in r["lost"]]
    print(f"{name:<7} val bpb {mean_sd([r['bpb'] for r in results])}  wall {mean_sd([r['wall'] for r in results], digits=0)} s  "
          f"rounds {mean_sd([r['rounds'] for r in results], digits=1)}  workers/round "
          f"{mean_sd([r['workers'] for r in results], digits=2)}  redone {sum(r['redone'] for r in results)}")
    print("        bytes over all workers: " + ", ".join(
        f"{t} {statistics.mean(r['bytes'].get(t, 0) for r in results) / 1e6:.2f} MB" for t in tags))
    if lost:
        print(f"        membership changes: {len(lost)}, seconds lost per change: median {statistics.median(lost):.2f}, "
              f"max {max(lost):.2f} (median round {statistics.median(r['wall'] / r['rounds'] for r in results):.2f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=sorted(METHODS), default="diloco", help="the method the jobs train")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=1_000_000)
    p.add_argument("--out", help="where the jobs go (default: a temporary directory)")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="lowband-elastic-")
    print(f"commit {commit()}; {args.method}; jobs in {out}", flush=True)
    results: dict[str, list[dict]] = {"steady": [], "churn": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in results:
            print(f"{name} seed {seed}", flush=True)
            results[name].append(job(seed, name == "churn", args, out))
    for name, res in results.items():
        report(name, res)
    steady, churn = ([r["bpb"] for r in results[k]] for k in ("steady", "churn"))
    spread = max(statistics.stdev(steady) if len(steady) > 1 else 0.0, statistics.stdev(churn) if len(churn) > 1 else 0.0)
    gap = statistics.mean(churn) - statistics.mean(steady)
    verdict = "within noise" if abs(gap) <= 2 * spread else "NOT within noise"
    print(f"churn - steady: {gap:+.4f} bpb ({100 * gap / statistics.mean(steady):+.2f}%), seed spread {spread:.4f}: {verdict}")


if __name__ == "__main__":
    main()
