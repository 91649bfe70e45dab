"""A pruned search against the full grid: DiLoCo on the lm suite tuned jointly (inner lr x outer lr x tau).

Both searches tune `diloco` (the lm suite's workload: byte-level GPT "tiny" on the first 1 MB of the KJV
text, context 64, batch 16, 4 workers, AdamW inner optimizer, Nesterov outer) over the same space,
every trial a real `lowband train` run of `--epochs` epochs on seed 0, through lowband's own tuning
(lowband.comparison.tuning, Optuna):

- grid: every combination of --lrs x --outer x --taus, no pruning (what the one-field `--tune` did);
- pruned: `--trials` TPE trials over the same lists (seed --seed), median pruner on the validation
  loss of each epoch.

Prints per search the trials run and pruned, the best final validation bits per byte it found and its
values, and the CPU seconds it took (user + system of every trial process and its workers: this
process's children), then the pruned search's best against the grid's (within the metric's 1% margin,
the project's "reaches" for bits per byte) and its CPU time as a fraction of the grid's. Goal: within
the margin in a quarter of the grid's time or less. The searches run one after the other on the same
machine: on a shared machine their times are a ratio, not a dedicated machine's figures.

Run: python benchmarks/tuning_search.py [--epochs 2] [--trials 4] [--lrs 0.001,0.002,0.004] [--outer 0.5,0.9]
     [--taus 16,32] [--seed 0] [--out DIR] [--max-bytes N]
About 25 minutes on 2 cores with the defaults (a trial of 2 epochs takes about 100 s).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

from common import commit
from lowband.catalog import load_all
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.request import Request, plan_for
from lowband.comparison.space import parse_tune
from lowband.comparison.tuning import tune_label
from lowband.data.metric import BITS_PER_BYTE

LABEL = "diloco"
MARGIN = BITS_PER_BYTE.margin


def children_cpu() -> float:
    """User + system seconds of this process's finished children (and the children they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def search(name: str, args, out: str, trials: int | None, sampler: str, pruner: str) -> dict:
    """One search in its own comparison folder: its rows, chosen row, CPU and wall seconds."""
    specs = [f"optim.lr={args.lrs}", f"method.outer_lr={args.outer}", f"method.tau={args.taus}"]
    tune = parse_tune(specs, args.epochs, trials, sampler, args.seed, pruner)
    overrides: dict = {"train": {"epochs": args.epochs}}
    if args.max_bytes:
        overrides["data"] = {"max_bytes": args.max_bytes}
    plan, folder = plan_for(Request(methods=[LABEL], suite="lm", overrides=overrides, seeds=[0], tune=tune,
                                    out=os.path.join(out, name)))
    ComparisonDir(folder).save_plan(plan)
    cpu, wall = children_cpu(), time.perf_counter()
    result = tune_label(folder, plan, LABEL, BITS_PER_BYTE)
    assert result is not None, "interrupted"
    rows, _ = result
    best = next((r for r in rows if r.is_chosen), None)
    return {"name": name, "rows": rows, "best": best, "cpu": children_cpu() - cpu, "wall": time.perf_counter() - wall,
            "folder": folder}


def show(s: dict) -> str:
    best = s["best"]
    found = "nothing finished" if best is None else (
        f"best val bpb {best.val:.4f} at " + ", ".join(f"{k}={v}" for k, v in best.values.items()))
    pruned = sum(r.status == "pruned" for r in s["rows"])
    epochs = sum(r.epochs for r in s["rows"])
    return (f"{s['name']:<7} {len(s['rows']):>2} trials ({pruned} pruned, {epochs} trial-epochs): {found}; "
            f"CPU {s['cpu']:.0f} s, wall {s['wall']:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trials", type=int, default=4, help="trials of the pruned search")
    p.add_argument("--lrs", default="0.001,0.002,0.004", help="inner (AdamW) learning rates")
    p.add_argument("--outer", default="0.5,0.9", help="outer learning rates")
    p.add_argument("--taus", default="16,32", help="inner steps between outer steps")
    p.add_argument("--seed", type=int, default=0, help="the TPE sampler's seed")
    p.add_argument("--max-bytes", type=int, default=0, help="text bytes (default 0: the suite's 1 MB; smaller to try "
                                                            "the script quickly)")
    p.add_argument("--out", default=None, help="where the two comparison folders go (default: a temporary one)")
    args = p.parse_args()
    load_all()
    out = args.out or tempfile.mkdtemp(prefix="tuning_search-")
    grid = search("grid", args, out, None, "grid", "none")
    pruned = search("pruned", args, out, args.trials, "tpe", "median")
    text = f"first {args.max_bytes:,} bytes" if args.max_bytes else "first 1 MB"
    print(f"\nDiLoCo on the lm suite (GPT tiny, KJV {text}, context 64, batch 16, 4 workers), {args.epochs} epochs a "
          f"trial, seed 0; space optim.lr in {{{args.lrs}}} x method.outer_lr in {{{args.outer}}} x method.tau in "
          f"{{{args.taus}}}; commit {commit()}; folders under {out}")
    for s in (grid, pruned):
        print(show(s))
    if grid["best"] is not None and pruned["best"] is not None:
        gap = pruned["best"].val / grid["best"].val - 1.0
        verdict = "within" if gap <= MARGIN else "outside"
        print(f"pruned best vs grid best: {100 * gap:+.2f}% ({verdict} the {MARGIN:.0%} margin); "
              f"CPU {pruned['cpu'] / grid['cpu']:.2f}x the grid's, wall {pruned['wall'] / grid['wall']:.2f}x "
              f"(goal: within the margin at 0.25x or less)")


if __name__ == "__main__":
    main()
