"""Does `make demo`'s verdict move with the seed? Runs the demo suite once per seed, as `make demo` does
(`lowband compare --suite demo --seed S`), and prints per seed: which methods reach the target (within
1% of Allreduce's final validation bits per byte), the fastest method at 10 mbit/s on dedicated
machines (and, when that is one worker, the fastest of those on every worker), and each method's final
validation bits per byte; then which parts of the verdict agree over the seeds.

Run: python benchmarks/demo_verdicts.py [--seeds 0,1,2] [--config SUITE.toml] [--budget target:4] [--out DIR]
(about 7 minutes a seed on 2 cores). `--config` tries a candidate suite instead of the built-in demo;
`--report-only --out DIR` prints the verdicts of comparisons already run there.
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


def verdict(folder: str) -> tuple[tuple[str, ...], str, str, dict[str, float]]:
    """(labels that reach the target, the fastest at 10 mbit with its seconds, the fastest of the methods on
    every worker there (the fastest itself when it uses them all), final val bpb per label) of one comparison."""
    runs = report.load_runs([folder])
    rows, _, _ = table.rows(runs)
    reach = tuple(r.label for r in rows if r.epochs_to_target is not None)
    sentence = next(s for s in report.verdict([folder]) if s.startswith("At 10 mbit"))
    fastest = re.search(r"the fastest to target is (\S+) \(([\d.]+) s", sentence)
    team = re.search(r"on all \d+ workers \([^)]*\) (\S+) \(([\d.]+) s\)", sentence)
    first = f"{fastest.group(1)} ({fastest.group(2)} s)" if fastest else "-"
    return reach, first, f"{team.group(1)} ({team.group(2)} s)" if team else first, \
        {r.label: r.val.mean for r in rows if r.val}


def run_seed(seed: str, where: str, args) -> str:
    """`lowband compare` of the suite at `seed` under `where`; its comparison folder."""
    if not args.report_only:
        suite = ["--config", args.config] if args.config else ["--suite", "demo"]
        budget = ["--budget", args.budget] if args.budget else []
        done = subprocess.run([sys.executable, "-m", "lowband", "compare", *suite, *budget, "--seed", seed, "--out",
                               where, "-q"], check=False, stdout=subprocess.DEVNULL)
        code = f"lowband compare exited {done.returncode}"
    else:
        code = "--report-only"
    folders = glob.glob(os.path.join(where, "compare-*"))
    if not folders:
        sys.exit(f"seed {seed}: {code} before making a comparison in {where}")
    return max(folders, key=os.path.getmtime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=None)
    p.add_argument("--config", default=None, help="a suite TOML to try instead of the built-in demo")
    p.add_argument("--budget", default=None, help="passed to lowband compare (default: the suite's)")
    p.add_argument("--report-only", action="store_true", help="read the comparisons already in --out, run nothing")
    args = p.parse_args()
    if args.report_only and not args.out:
        p.error("--report-only reads --out; give it")
    out = args.out or tempfile.mkdtemp(prefix="demo_verdicts_")
    parts: dict[str, list] = {"reach the target": [], "fastest at 10 mbit": [], "fastest on every worker at 10 mbit": []}
    for seed in args.seeds.split(","):
        reach, fastest, team, bpb = verdict(run_seed(seed, os.path.join(out, f"seed{seed}"), args))
        for part, value in zip(parts, (reach, fastest.split(" (")[0], team.split(" (")[0]), strict=True):
            parts[part].append(value)
        shown = ", ".join(f"{label} {value:.4f}" for label, value in bpb.items())
        print(f"seed {seed}: reach the target: {', '.join(reach) or 'none'}; fastest at 10 mbit (dedicated): "
              f"{fastest}{f'; on every worker: {team}' if team != fastest else ''}; val bpb: {shown}", flush=True)
    agree = [part for part, values in parts.items() if len(set(values)) == 1]
    differ = [part for part in parts if part not in agree]
    print(f"\ncommit {commit()}; over seeds {args.seeds} the verdicts "
          f"{'agree' if not differ else 'DIFFER in ' + ', '.join(differ)}"
          f"{' (they agree in ' + ', '.join(agree) + ')' if differ and agree else ''}")


if __name__ == "__main__":
    main()
