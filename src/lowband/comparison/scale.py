"""What the scale ladder says about a language-model comparison's size (issue 54).

`benchmarks/ladder.py --report --publish` writes benchmarks/results/ladder.json: per GPT size, each saver's
gap to Allreduce (final validation bits per byte, at equal samples) and its bytes ratio, on held-out seeds
where they have run. A report on a language model quotes it, so that a verdict measured at one size is
read beside how the gaps move with size. `benchmarks/workers.py --report --publish` writes workers.json
beside it: the same gaps per cell of (size, workers, epochs); a report quotes the cell nearest its own.
No benchmark writes into the package: an installed release carries the two files as package data (setup.py
copies them into lowband/comparison/published/), and a checkout reads them where they are committed.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import metric_of
from lowband.data.metric import BITS_PER_BYTE


def ladder() -> dict:
    """The published ladder summary ({} when missing or unreadable)."""
    return published("ladder.json")


def pools() -> dict:
    """The published worker-axis summary ({} when missing or unreadable)."""
    return published("workers.json")


#: where a checkout keeps the published summaries (src/lowband/comparison/ -> the repository's root)
CHECKOUT = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def published(name: str) -> dict:
    """A published summary: the release's copy (package data), else the checkout's committed file; {} if
    neither is there or readable."""
    for source in (resources.files("lowband.comparison").joinpath("published", name), CHECKOUT / name):
        try:
            return json.loads(source.read_text())
        except (OSError, ValueError):
            continue
    return {}


def scale_note(runs: list[SummaryRow], found: dict | None = None) -> list[str]:
    """Sentences for a language-model comparison: the ladder's gaps per size, and which size this
    comparison's model is nearest (by parameter count, on a log scale). [] for a workload not measured
    in bits per byte."""
    found = ladder() if found is None else found
    sizes = [s for s in found.get("sizes", []) if s.get("methods")]
    if not sizes or metric_of(runs) is not BITS_PER_BYTE:
        return []
    parts = [f"{s['size']} ({s['params']:,} parameters): " + ", ".join(_method(m) for m in s["methods"])
             for s in sizes]
    line = (f"Model size: the scale ladder (BENCHMARKS.md; {found.get('workload', 'GPT on the KJV')}) measured "
            f"each saver's gap to Allreduce's validation bits per byte by size: {'; '.join(parts)}.")
    params = next((r.records[-1].params for r in runs if r.records and r.records[-1].params), None)
    if params:
        near = min(sizes, key=lambda s: abs(math.log(s["params"] / params)))
        line += f" This comparison's model has {params:,} parameters, nearest to {near['size']}."
    return [line]


def pool_note(runs: list[SummaryRow], found: dict | None = None) -> list[str]:
    """A sentence for a language-model comparison: the measured cell (GPT size, workers, epochs) of the
    worker-axis study nearest this comparison's model size, workers and epochs (each on a log scale, summed),
    with each saver's validation and training-loss gaps there. [] for another workload or no cell."""
    found = pools() if found is None else found
    cells = [c for c in found.get("cells", []) if c.get("methods")]
    last = next((r.records[-1] for r in runs if r.records and r.records[-1].params), None)
    if not cells or last is None or metric_of(runs) is not BITS_PER_BYTE:
        return []
    params, epochs = last.params or 1, max(last.epoch, 1)
    workers = max((r.workers for r in runs if r.method != "single"), default=1)

    def distance(c: dict) -> float:
        return (abs(math.log(c["params"] / params)) + abs(math.log(c["workers"] / workers))
                + abs(math.log(c["epochs"] / epochs)))

    near = min(cells, key=distance)
    gaps = ", ".join(f"{m['method']} {m['gap_pct']:+.2f}% (training loss {m['train_gap_pct']:+.2f}%{_by_seed(m)}) at "
                     f"{math.floor(m['fewer_bytes']):,}x fewer bytes ({m['seeds']})" for m in near["methods"])
    return [f"Pool: this comparison ({params:,} parameters, {workers} workers, {_epochs(epochs)}) is nearest the "
            f"worker-axis cell {near['size']} with {near['workers']} workers and {_epochs(near['epochs'])} "
            f"(benchmarks/workers.py; {found.get('workload', 'GPT on the KJV')}), where the gaps to Allreduce's "
            f"validation bits per byte were: {gaps}."]


def _epochs(n: int) -> str:
    return f"{n} epoch" + "s" * (n != 1)


def _by_seed(m: dict) -> str:
    """'; by seed: +11.74, -4.73, -4.86%' where the summary has each held-out seed's gap (a mean can hide them)."""
    return "; by seed: " + ", ".join(f"{g:+.2f}" for g in m["seed_gaps_pct"]) + "%" if m.get("seed_gaps_pct") else ""


def _method(m: dict) -> str:
    return f"{m['method']} {m['gap_pct']:+.2f}% at {math.floor(m['fewer_bytes']):,}x fewer bytes ({m['seeds']})"
