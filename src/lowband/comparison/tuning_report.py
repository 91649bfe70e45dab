"""The report's Tuning section, from each comparison's tuning.csv (lowband.comparison.summary.TuningRow).

A summary table (per method: the fields, every value tried with its validation figure, the chosen
value), then per method the chosen values, every trial (values, validation figure: final, or the one
it was stopped at when pruned; epochs run; state) and a plot of the validation figure against each
tuned field, a panel per field, the first for the field that matters most: the one whose values rank
its finished trials' figures best (largest |Spearman correlation|; pruned trials stopped at other
epochs are left out of that choice).
"""

from __future__ import annotations

import os

from lowband.comparison import coverage, plots
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.plan import safe
from lowband.comparison.space import Param
from lowband.comparison.summary import TuningRow
from lowband.data.metric import ACCURACY, BITS_PER_BYTE, Metric
from lowband.run.rundir import warn


def load_tuning(folders: list[str], prefixes: list[str]) -> list[TuningRow]:
    """Every folder's tuning.csv rows, labels prefixed; rows naming no label or field are skipped with a warning."""
    out = []
    for folder, prefix in zip(folders, prefixes, strict=True):
        try:
            rows = ComparisonDir.of(folder).read_tuning()
        except (OSError, UnicodeDecodeError, ValueError) as e:
            warn(f"skipping {ComparisonDir.of(folder).tuning_path}: unreadable ({type(e).__name__})")
            continue
        for row in rows:
            if not (row.label and row.field):
                warn(f"skipping a row of {ComparisonDir.of(folder).tuning_path}: no label or field")
                continue
            row.label = prefix + row.label
            out.append(row)
    return out


def metric_of(rows: list[TuningRow]) -> Metric:
    return BITS_PER_BYTE if any(r.metric == BITS_PER_BYTE.val_key for r in rows) else ACCURACY


def section(rows: list[TuningRow], out: str, spaces: dict[str, tuple[list[Param], str]] | None = None) -> list[str]:
    """Markdown lines of the Tuning section (and its plots written into `out`); [] without tuning. `spaces`:
    each label's tuned fields and sampler (lowband.comparison.coverage.spaces), for what was tried."""
    if not rows:
        return []
    metric = metric_of(rows)
    by_label: dict[str, list[TuningRow]] = {}
    for r in rows:
        by_label.setdefault(r.label, []).append(r)
    lines = [f"| method | setting | values tried (validation {metric.name}) | chosen |", "|---|---|---|---|"]
    for label, tried in by_label.items():
        chosen = [shown_values(r) for r in tried if r.is_chosen]
        shown = ", ".join(f"{shown_values(r)} ({tried_figure(r)})" for r in tried)
        lines.append(f"| {label} | {'/'.join(tried[0].field.split())} | {shown} | {', '.join(chosen) or '-'} |")
    for label, tried in by_label.items():
        params, sampler = (spaces or {}).get(label, ([], ""))
        lines += [""] + per_method(label, tried, metric, out, coverage.sentences(tried, params, sampler))
    return lines


def seeds_said(folders: list[ComparisonDir]) -> list[str]:
    """Per comparison that tuned, whether its published runs informed the choice: held out when the trials'
    training seed is not among its seeds, in-sample for that seed when it is."""
    lines = []
    for folder in folders:
        seeds = folder.tuning_seeds()
        if seeds is None:
            continue
        trial, published = seeds
        shown = ", ".join(map(str, published)) or str(trial)
        on = f"seed{'s' * (len(published) > 1)} {shown}"
        where = f" ({folder.path})" if len(folders) > 1 else ""
        if published and trial not in published:
            lines.append(f"Every trial trained on seed {trial}; the results above are on {on}, which "
                         f"informed no choice: they are held out{where}.")
        else:
            lines.append(f"Every trial trained on seed {trial}, which is also one of the results' seeds ({shown}): on "
                         f"it the chosen values are judged on the runs that chose them (in-sample){where}. "
                         f"`--tune-on S` with a seed outside `--seeds` keeps choosing and judging apart.")
    return lines


def shown_values(row: TuningRow) -> str:
    """A trial's values, 4 significant digits, '/' between fields in the order of `field`: '0.003/16'."""
    return "/".join(_number(v) for v in row.value.split())


def tried_figure(row: TuningRow) -> str:
    """A trial's figure, or why it has none ('pruned after epoch 1: 0.4120', 'diverged', 'failed (1)')."""
    figure = "-" if row.val is None else f"{row.val:.4f}"
    if row.status == "ok":
        return figure
    return f"pruned after epoch {row.epochs}: {figure}" if row.status == "pruned" else row.status


def per_method(label: str, rows: list[TuningRow], metric: Metric, out: str, said_of_space: list[str]) -> list[str]:
    """One method's chosen values, what of its space was tried, its trials and its plot."""
    fields = rows[0].field.split()
    best = next((r for r in rows if r.is_chosen), None)
    said = (f"chosen: trial {best.trial}, {' '.join(f'{f}={v}' for f, v in best.values.items())} (validation "
            f"{metric.name} {tried_figure(best)})") if best else "no trial finished: it ran with its own settings"
    pruned = sum(r.status == "pruned" for r in rows)
    lines = [f"### {label}", "", f"{len(rows)} trials, {pruned} pruned; {said}.", ""]
    lines += [f"- {s}" for s in said_of_space] + ([""] if said_of_space else [])
    lines += ["| trial | " + " | ".join(fields) + f" | validation {metric.short} | epochs | state |",
              "|---|" + "---|" * (len(fields) + 3)]
    for r in rows:
        values = [_number(r.values.get(f, "")) for f in fields]
        state = r.status + (" (chosen)" if r.is_chosen else "")
        lines.append(f"| {r.trial} | " + " | ".join(values) + f" | {'-' if r.val is None else f'{r.val:.4f}'} | "
                     f"{r.epochs} | {state} |")
    first = important(rows, fields)
    panels = {field: [(float(r.values[field]), r.val, r.status, r.is_chosen) for r in rows
                      if r.val is not None and field in r.values and r.status in ("ok", "pruned")]
              for field in [first] + [f for f in fields if f != first]}
    if any(panels.values()):
        name = f"tuning-{safe(label)}"
        plots.tuning(panels, metric, f"{label}: every trial against each tuned field", ComparisonDir.of(out).plot_path(name))
        lines += ["", f"![tuning]({os.path.basename(ComparisonDir.of(out).plot_path(name))})"]
    return lines


def _number(text: str) -> str:
    try:
        return f"{float(text):.4g}"
    except ValueError:
        return text or "-"


def important(rows: list[TuningRow], fields: list[str]) -> str:
    """The field whose values rank the finished trials' validation figures best (largest |Spearman|; ties:
    the first field)."""
    done = [r for r in rows if r.status == "ok" and r.val is not None]
    def strength(field: str) -> float:
        pairs = [(float(r.values[field]), float(r.val or 0.0)) for r in done if field in r.values]
        return abs(spearman(pairs)) if len(pairs) >= 3 else 0.0

    return max(fields, key=strength) if fields else ""


def spearman(pairs: list[tuple[float, float]]) -> float:
    """Spearman's rank correlation of (x, y) pairs (ties share their mean rank); 0 when a side is constant."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks([x for x, _ in pairs]), ranks([y for _, y in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx, sy = sum((a - mx) ** 2 for a in rx) ** 0.5, sum((b - my) ** 2 for b in ry) ** 0.5
    return 0.0 if sx == 0 or sy == 0 else cov / (sx * sy)
