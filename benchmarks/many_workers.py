"""Many workers on one machine (issue 64): `lowband train --workers K` at K = 4 and K = 64 side by side, the
same samples (each worker a batch of 16 windows, so K = 64 takes 1/16 of K = 4's steps), its wall time and
the machine's peak memory in use while it ran (MemTotal - MemAvailable, sampled every 0.2 s, less what was
in use before it started).

Run:  python benchmarks/many_workers.py [--size tiny] [--workers 4,64] [--epochs 1] [--max-bytes 0]
      [--method diloco] [--out runs/many_workers]
It prints one line per K and the ratios to the first K. Each run is a real `lowband train` (forked worker
processes, gloo over loopback); run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time

from common import commit


def in_use_mb() -> float:
    """MemTotal - MemAvailable, in MB."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def measure(argv: list[str]) -> tuple[int, float, float]:
    """Run `python -m lowband train ARGV`; (exit code, wall seconds, peak MB in use above the start)."""
    before, peak, done = in_use_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], in_use_mb() - before)
            time.sleep(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.time()
    code = subprocess.run([sys.executable, "-m", "lowband", "train", "-q", *argv], check=False).returncode
    wall = time.time() - t0
    done.set()
    watcher.join()
    return code, wall, peak[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny", choices=("nano", "tiny", "small"), help="GPT size (default tiny)")
    p.add_argument("--workers", default="4,64", help="comma-separated worker counts, the first the reference")
    p.add_argument("--epochs", type=int, default=1, help="epochs of every run (default 1)")
    p.add_argument("--max-bytes", type=int, default=0, help="data.max_bytes (0: the whole KJV, 4.3 MB)")
    p.add_argument("--method", default="diloco", help="the method (default diloco, tau 16)")
    p.add_argument("--out", default="runs/many_workers", help="parent of the run directories")
    args = p.parse_args()
    try:
        counts = [int(k) for k in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers {args.workers!r}: give comma-separated integers, e.g. 4,64")
    if not counts or any(not 1 <= k <= 256 for k in counts):
        p.error(f"--workers {args.workers!r}: each in [1, 256]")
    if not 1 <= args.epochs <= 100 or args.max_bytes < 0:
        p.error("--epochs in [1, 100], --max-bytes >= 0")
    print(f"many_workers.py, commit {commit()}: {args.method} at {args.size}, {args.epochs} epoch(s), batch 16 a "
          f"worker, data.max_bytes={args.max_bytes}; {os.cpu_count()} cores")
    first = None
    for k in counts:
        run = os.path.join(args.out, f"{args.size}-k{k}")
        shutil.rmtree(run, ignore_errors=True)
        code, wall, peak = measure(["--method", args.method, "--workers", str(k), "--epochs", str(args.epochs),
                                    "--dataset", "text", "--model", "gpt", "--set", f"model.size='{args.size}'",
                                    "--set", f"data.max_bytes={args.max_bytes}", "--set", "data.context=64",
                                    "--batch-size", "16", "--run-dir", run,
                                    *(["--set", "method.tau=16"] if args.method in ("diloco", "local_sgd") else []),
                                    *(["--set", "method.round_evals=0"] if args.method != "allreduce" else [])])
        first = first or (wall, peak)
        print(f"K={k:3}: exit {code}, wall {wall:7.1f} s ({wall / first[0]:.2f}x), peak memory {peak / 1024:6.2f} GB "
              f"({peak / max(first[1], 1):.1f}x)", flush=True)


if __name__ == "__main__":
    main()
