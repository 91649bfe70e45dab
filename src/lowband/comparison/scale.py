"""What the scale ladder says about a language-model comparison's size (issue 54).

`benchmarks/ladder.py --report --publish` writes ladder.json beside this module: per GPT size, each saver's gap
to Allreduce (final validation bits per byte, at equal samples) and its bytes ratio, on held-out seeds
where they have run. A report on a language model quotes it, so that a verdict measured at one size is
read beside how the gaps move with size.
"""

from __future__ import annotations

import json
import math
from importlib import resources

from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import metric_of
from lowband.data.metric import BITS_PER_BYTE


def ladder() -> dict:
    """The packaged ladder summary ({} when missing or unreadable)."""
    try:
        return json.loads(resources.files("lowband.comparison").joinpath("ladder.json").read_text())
    except (OSError, ValueError):
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


def _method(m: dict) -> str:
    return f"{m['method']} {m['gap_pct']:+.2f}% at {math.floor(m['fewer_bytes']):,}x fewer bytes ({m['seeds']})"
