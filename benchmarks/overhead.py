"""lowband `allreduce` against a plain PyTorch DDP script: same model, data, K and batch, interleaved,
each first in turn (a job started right after another shares the cores with that one's exit).

Prints the median training step time of each (first epoch dropped as warm-up) and their ratio.
Goal: ratio <= 1.05. Run: python benchmarks/overhead.py [--workers 4] [--epochs 10] [--rounds 3]

`--against DIR` adds, in every round, lowband from another checkout (DIR/src: `git worktree add DIR REV`),
so that a change to the training loop is timed against the code before it, interleaved on one machine.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)


def plain(workers: int, epochs: int, batch: int, tmp: str) -> list[float]:
    out = os.path.join(tmp, "plain.json")
    subprocess.run([os.path.join(BIN, "torchrun"), "--standalone", f"--nproc-per-node={workers}",
                    os.path.join(HERE, "plain_ddp.py"), f"--epochs={epochs}", f"--batch={batch}", f"--out={out}"],
                   check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)["step_s"][1:]


def lowband(workers: int, epochs: int, batch: int, tmp: str, src: str | None = None) -> list[float]:
    """Step times of `lowband train --method allreduce`; `src`: another checkout's source folder to run."""
    run = os.path.join(tmp, "lowband")
    shutil.rmtree(run, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": src} if src else None
    subprocess.run([sys.executable, "-m", "lowband", "train", "--method", "allreduce", f"--workers={workers}",
                    f"--epochs={epochs}", f"--batch-size={batch}", "--run-dir", run, "--set", "train.checkpoint_every=0"],
                   check=True, capture_output=True, env=env)
    from lowband.run.metrics import read_metrics

    records = read_metrics(run)
    steps = records[0].steps or 1
    return [(r.time["compute_s"] + r.time["comm_s"] + r.time["wait_s"]) / steps for r in records[1:]]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--against", metavar="DIR", help="another checkout of lowband, timed in every round too")
    a = p.parse_args()
    if a.against and not os.path.isdir(os.path.join(a.against, "src", "lowband")):
        p.error(f"--against: {a.against} has no src/lowband (make one with `git worktree add DIR REV`)")
    ours, theirs, before = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [lambda: theirs.extend(plain(a.workers, a.epochs, a.batch, tmp)),
                lambda: ours.extend(lowband(a.workers, a.epochs, a.batch, tmp))]
        if a.against:
            jobs.append(lambda: before.extend(lowband(a.workers, a.epochs, a.batch, tmp, os.path.join(a.against, "src"))))
        for i in range(a.rounds):
            for job in jobs[i % len(jobs):] + jobs[:i % len(jobs)]:  # each goes first in turn: no order bias
                job()
            other = f", {a.against} {statistics.median(before) * 1e3:.2f} ms/step" if before else ""
            print(f"round {i + 1}: plain DDP {statistics.median(theirs) * 1e3:.2f} ms/step, "
                  f"lowband {statistics.median(ours) * 1e3:.2f} ms/step{other}", flush=True)
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"\nworkers {a.workers}, batch {a.batch}/worker, cnn1d on MNIST-1D, {len(ours)} epochs each, "
          f"{os.cpu_count()} cores")
    print(f"plain DDP  median step {m_theirs * 1e3:.2f} ms")
    print(f"lowband    median step {m_ours * 1e3:.2f} ms")
    print(f"ratio lowband / plain DDP = {m_ours / m_theirs:.3f}  (goal <= 1.05)")
    if before:
        m_before = statistics.median(before)
        print(f"{a.against}  median step {m_before * 1e3:.2f} ms; ratio this tree / it = {m_ours / m_before:.3f}")


if __name__ == "__main__":
    main()
