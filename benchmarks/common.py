"""What the benchmark scripts share: run `lowband compare` and read back its summary."""

import csv
import glob
import os
import statistics
import subprocess
import sys


def run_compare(args: list[str], out: str) -> list[dict]:
    """Run `lowband compare ARGS --out OUT`; the rows of its summary.csv (a failed run is a row)."""
    subprocess.run([sys.executable, "-m", "lowband", "compare", *args, "--out", out], check=False, capture_output=True)
    folder = max(glob.glob(os.path.join(out, "compare-*")), key=os.path.getmtime)
    with open(os.path.join(folder, "summary.csv")) as f:
        return list(csv.DictReader(f))


def method_flags(spec: str, round_evals: bool = True) -> list[str]:
    """A method spec as `lowband train` flags: `diloco:tau=16:outer_lr=0.7` is
    `--method diloco --set method.tau=16 --set method.outer_lr=0.7`. `round_evals=False` adds
    `method.round_evals=0` to a method that has it (all but allreduce and single): a study reads the epochs'
    figures, and each round's own evaluation would take most of a small model's time."""
    name, *opts = spec.split(":")
    quiet = [] if round_evals or name in ("allreduce", "single") else ["--set", "method.round_evals=0"]
    return ["--method", name, *[a for o in opts for a in ("--set", "method." + o)], *quiet]


def commit() -> str:
    """The short hash of the checked-out commit, to print beside a benchmark's figures."""
    if os.environ.get("LOWBAND_COMMIT"):  # a copy of the tree without its .git (a GPU machine) says it
        return os.environ["LOWBAND_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def mean_sd(values: list[float], scale: float = 1.0, digits: int = 4) -> str:
    """'mean ± sd' of `values` times `scale` (sd 0 for one value), to `digits` decimals."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{scale * statistics.mean(values):.{digits}f} ± {scale * sd:.{digits}f}"
