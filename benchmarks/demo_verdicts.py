"""Does `make demo`'s verdict move with the seed? Runs the demo suite once per seed, as `make demo` does
(`lowband compare --suite demo --seed S`), and prints per seed: which methods reach the target (within
1% of Allreduce's final validation bits per byte), the fastest method at 10 mbit/s on dedicated
machines, and each method's final validation bits per byte; then whether the verdicts agree.

Run: python benchmarks/demo_verdicts.py [--seeds 0,1,2] [--config SUITE.toml] [--budget target:4]
(about 7 minutes a seed on 2 cores). `--config` tries a candidate suite instead of the built-in demo.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

from common import commit
from lowband.comparison import report, table


def verdict(folder: str) -> tuple[list[str], str, dict[str, float]]:
    """(labels that reach the target, the fastest at 10 mbit, final val bpb per label) of one comparison."""
    runs = report.load_runs([folder])
    rows, _, _ = table.rows(runs)
    reach = [r.label for r in rows if r.epochs_to_target is not None]
    sentence = next(s for s in report.verdict([folder]) if s.startswith("At 10 mbit"))
    match = re.search(r"the fastest to target is (\S+)", sentence)
    return reach, match.group(1) if match else "-", {r.label: r.val.mean for r in rows if r.val}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=None)
    p.add_argument("--config", default=None, help="a suite TOML to try instead of the built-in demo")
    p.add_argument("--budget", default=None, help="passed to lowband compare (default: the suite's)")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="demo_verdicts_")
    verdicts = []
    for seed in args.seeds.split(","):
        where = os.path.join(out, f"seed{seed}")
        suite = ["--config", args.config] if args.config else ["--suite", "demo"]
        budget = ["--budget", args.budget] if args.budget else []
        done = subprocess.run([sys.executable, "-m", "lowband", "compare", *suite, *budget, "--seed", seed, "--out",
                               where, "-q"], check=False, stdout=subprocess.DEVNULL)
        folders = glob.glob(os.path.join(where, "compare-*"))
        if not folders:
            sys.exit(f"seed {seed}: lowband compare exited {done.returncode} before making a comparison")
        folder = max(folders, key=os.path.getmtime)
        reach, fastest, bpb = verdict(folder)
        verdicts.append((tuple(reach), fastest))
        shown = ", ".join(f"{label} {value:.4f}" for label, value in bpb.items())
        print(f"seed {seed}: reach the target: {', '.join(reach) or 'none'}; fastest at 10 mbit (dedicated): "
              f"{fastest}; val bpb: {shown}", flush=True)
    print(f"\ncommit {commit()}; the verdicts {'agree' if len(set(verdicts)) == 1 else 'DIFFER'} over seeds {args.seeds}")


if __name__ == "__main__":
    main()
