"""bf16 against fp32 (issue 67): the same `lowband train` run at train.precision fp32 and bf16, alternated
(fp32, bf16, fp32, bf16) so that a load on the shared machine falls on both, and each run's training samples a
second (its last record's samples_per_s) and final validation loss printed.

Run:  python benchmarks/precision.py [--size tiny] [--workers 2] [--max-bytes 100000] [--repeats 2]
      [--device cpu] [--out runs/precision]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from common import commit


def run(args, precision: str, i: int) -> dict:
    folder = os.path.join(args.out, f"{precision}-{i}")
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "lowband", "train", "-q", "--method", "allreduce", "--workers",
                    str(args.workers), "--epochs", "1", "--dataset", "text", "--model", "gpt",
                    "--set", f"model.size='{args.size}'", "--set", f"data.max_bytes={args.max_bytes}",
                    "--set", "data.context=64", "--batch-size", "16", "--set", f"train.precision='{precision}'",
                    "--set", f"train.device='{args.device}'", "--run-dir", folder], check=True)
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f][-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="tiny", choices=("nano", "tiny", "small", "medium", "large"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-bytes", type=int, default=100_000, help="data.max_bytes (0: the whole KJV)")
    p.add_argument("--repeats", type=int, default=2, help="pairs of runs (default 2)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--out", default="runs/precision")
    args = p.parse_args()
    if not (1 <= args.workers <= 64 and 1 <= args.repeats <= 20 and args.max_bytes >= 0):
        p.error("--workers in 1..64, --repeats in 1..20, --max-bytes >= 0")
    print(f"precision.py, commit {commit()}: allreduce, GPT {args.size}, {args.workers} workers, one epoch of "
          f"{args.max_bytes or 'all'} bytes of the KJV, batch 16 a worker, on {args.device}")
    seen: dict[str, list[dict]] = {"fp32": [], "bf16": []}
    for i in range(args.repeats):
        for precision in seen:
            rec = run(args, precision, i)
            seen[precision].append(rec)
            print(f"  {precision} #{i}: {rec['samples_per_s']:.1f} samples/s, val loss {rec['val_loss']:.4f}",
                  flush=True)
    rate = {k: statistics.mean(r["samples_per_s"] for r in v) for k, v in seen.items()}
    loss = {k: statistics.mean(r["val_loss"] for r in v) for k, v in seen.items()}
    print(f"bf16 against fp32: {rate['bf16'] / rate['fp32']:.2f}x the samples a second; validation loss "
          f"{100 * (loss['bf16'] / loss['fp32'] - 1):+.3f}%")


if __name__ == "__main__":
    main()
