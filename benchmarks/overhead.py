"""lowband `allreduce` against a plain PyTorch DDP script: same model, data, K and batch, interleaved.

Prints the median training step time of each (first epoch dropped as warm-up) and their ratio.
Goal: ratio <= 1.05. Run: python benchmarks/overhead.py [--workers 4] [--epochs 10] [--rounds 3]
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


def lowband(workers: int, epochs: int, batch: int, tmp: str) -> list[float]:
    run = os.path.join(tmp, "lowband")
    shutil.rmtree(run, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "lowband", "train", "--method", "allreduce", f"--workers={workers}",
                    f"--epochs={epochs}", f"--batch-size={batch}", "--run-dir", run, "--set", "train.checkpoint_every=0"],
                   check=True, capture_output=True)
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
    a = p.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            theirs += plain(a.workers, a.epochs, a.batch, tmp)
            ours += lowband(a.workers, a.epochs, a.batch, tmp)
            print(f"round {i + 1}: plain DDP {statistics.median(theirs) * 1e3:.2f} ms/step, "
                  f"lowband {statistics.median(ours) * 1e3:.2f} ms/step", flush=True)
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"\nworkers {a.workers}, batch {a.batch}/worker, cnn1d on MNIST-1D, {len(ours)} epochs each, "
          f"{os.cpu_count()} cores")
    print(f"plain DDP  median step {m_theirs * 1e3:.2f} ms")
    print(f"lowband    median step {m_ours * 1e3:.2f} ms")
    print(f"ratio lowband / plain DDP = {m_ours / m_theirs:.3f}  (goal <= 1.05)")


if __name__ == "__main__":
    main()
