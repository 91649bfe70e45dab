"""How much of its space a method's search tried, and whether its choice sits on the space's edge.

Read by the console after each method's search and by the report's Tuning section, from the
trials (lowband.comparison.summary.TuningRow) and the plan's `--tune` fields (space.Param):

- a discrete space (every field a list): its settings, how many were tried (distinct; a repeat is not
  a second try), how many of those were pruned, how many were never tried, and the CPU seconds the
  trials took (tuning.csv's cpu_s); and under the axis search
  the chosen setting's one-field changes that never ran;
- an edge: the chosen value is the smallest or largest of a list of 3 values or more, or lies in the
  outer tenth of a range (measured on a log scale for a log range). The best may then lie beyond it,
  so the sentence says which way to widen the space.
"""

from __future__ import annotations

import math
import os

from lowband.comparison.folder import ComparisonDir
from lowband.comparison.space import Param, show
from lowband.comparison.summary import TuningRow
from lowband.errors import UsageError

EDGE_SHARE = 0.1  # a range's outer tenth counts as its edge


def spaces(folders: list[str], prefixes: list[str]) -> dict[str, tuple[list[Param], str]]:
    """{prefixed label: (its tuned Params, its sampler's name)} from each folder's plan.json (nothing for a
    folder without a readable plan)."""
    out: dict[str, tuple[list[Param], str]] = {}
    for folder, prefix in zip(folders, prefixes, strict=True):
        if not os.path.isfile(ComparisonDir.of(folder).file(ComparisonDir.PLAN)):
            continue
        try:
            plan = ComparisonDir.of(folder).load_plan()
        except UsageError:
            continue
        if plan.tune is None:
            continue
        for label, fields in (plan.tuned or {}).items():
            out[prefix + label] = ([plan.tune.param(f) for f in fields], plan.tune.sampler_name(fields))
    return out


def sentences(rows: list[TuningRow], params: list[Param], sampler: str = "") -> list[str]:
    """What a reader should know about one method's search: the share of the space tried, and edges."""
    if not params:
        return []
    out = []
    ran = [r for r in rows if not r.status.startswith("repeat")]
    tried = {r.value for r in ran}
    pruned = {r.value for r in ran if r.status == "pruned"}
    if all(p.is_list for p in params):
        size = math.prod(len(p.values) for p in params)
        never = size - len(tried)
        out.append(f"Space: {' x '.join(p.describe() for p in params)}: {size} settings; tried {len(tried)} "
                   f"({len(pruned)} pruned), never tried {never}.")
    else:
        out.append(f"Space: {' x '.join(p.describe() for p in params)}: tried {len(tried)} settings "
                   f"({len(pruned)} pruned).")
    out[-1] = out[-1][:-1] + cost(ran) + "."
    best = next((r for r in rows if r.is_chosen), None)
    if best is None:
        return out
    out += edges(best, params)
    if sampler == "axis" and all(p.is_list for p in params):
        out += neighbours(best, ran, params, never)
    return out


def cost(ran: list[TuningRow]) -> str:
    """'; 41 CPU s in all' when every trial's CPU is known (a study from before lowband counted it: nothing)."""
    if not ran or any(r.cpu_s is None for r in ran):
        return ""
    return f"; {sum(r.cpu_s or 0.0 for r in ran):.0f} CPU s in all"


def edges(best: TuningRow, params: list[Param]) -> list[str]:
    """A sentence per field whose chosen value sits on the edge of its list or range."""
    out = []
    for p in params:
        text = best.values.get(p.field)
        if text is None:
            continue
        side = edge_side(p, float(text))
        if side:
            out.append(f"Edge: the chosen {p.field}={text} is the {side} end of {p.describe()}; the best may lie "
                       f"{'below' if side == 'low' else 'above'} it: widen the space that way to know.")
    return out


def edge_side(p: Param, value: float) -> str:
    """'low', 'high' or '' (inside) for `value` in the parameter's list or range."""
    if p.is_list:
        numbers = sorted(float(v) for v in p.values)
        if len(numbers) < 3:
            return ""
        return "low" if value <= numbers[0] else "high" if value >= numbers[-1] else ""
    lo, hi = float(p.low or 0), float(p.high or 0)
    scale = (lambda x: math.log(x)) if p.log and lo > 0 and value > 0 else (lambda x: x)
    share = (scale(value) - scale(lo)) / (scale(hi) - scale(lo))
    return "low" if share <= EDGE_SHARE else "high" if share >= 1 - EDGE_SHARE else ""


def local_caveat(ran: list[TuningRow], never: int) -> str:
    """After an axis search that ended by itself with `never` settings never tried: that it is a local search,
    what running the rest would cost, and how (nothing when every setting ran)."""
    if never <= 0:
        return ""
    whole = [r.cpu_s for r in ran if r.status == "ok" and r.cpu_s is not None]
    price = f", about {never * sum(whole) / len(whole):.0f} CPU s more" if whole else ""
    return (f" A better setting two fields away or more may be among the {never} never tried: the axis search "
            "moves one field at a time (benchmarks/history/JOURNAL.md, 'Tuning defaults': it missed the grid's best on 2 of 5 "
            f"training seeds of the lm space). `--tune-sampler grid` runs them all{price}.")


def neighbours(best: TuningRow, ran: list[TuningRow], params: list[Param], never: int) -> list[str]:
    """Under the axis search: the chosen setting's one-field changes that never ran (none: it is the best
    along every field, and `never` settings of the space never ran)."""
    from lowband.comparison.axis import untried_neighbours  # imports Optuna: only a report that needs it pays

    space = {p.field: [show(v) for v in p.values] for p in params}
    tried = [r.values for r in ran]
    missing = untried_neighbours(space, best.values, tried)
    if not missing:
        return ["Every one-field change of the chosen setting was tried: it is the best along each field."
                + local_caveat(ran, never)]
    changes = [" ".join(f"{f}={v}" for f, v in m.items() if v != best.values.get(f)) for m in missing]
    shown = "; ".join(changes[:SHOWN]) + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")
    return [f"Not tried, {len(changes)} setting(s) one field away from the chosen one: {shown} (a larger "
            "--tune-trials runs them; --tune-sampler grid runs every setting)."]


SHOWN = 6  # untried one-field changes named in a sentence; the rest counted
