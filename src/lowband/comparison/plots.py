"""The report's plots. Every label has its own colour AND marker and line style, legends sit outside
the axes, seeds are drawn as a mean line with a shaded band of ± one standard deviation, and runs
that send nothing are drawn apart at the left edge of a log bytes axis, at a tick labelled "0 B".

Inputs are the comparison table's run groups (label -> runs with `records`), see lowband.comparison.table.
"""

from __future__ import annotations

import math
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import TableRow, evaluated
from lowband.data.metric import ACCURACY, Metric
from lowband.run.metrics import human_bytes
from lowband.units import si

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h"]
LINES = ["-", "--", "-.", ":"]
FIGSIZE = (9, 4.4)


def style(i: int) -> dict:
    """Colour, marker and line style of the i-th label: no two labels share all three."""
    colours = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]  # a ListedColormap
    return {"color": colours[i % 10], "marker": MARKERS[i % len(MARKERS)], "linestyle": LINES[(i // 10) % len(LINES)]}


def per_epoch(runs: list[SummaryRow], value) -> list[tuple[int, float, float, float]]:
    """(epoch, mean x, mean y, sd y) at every epoch all runs evaluated; `value(record)` -> (x, y)."""
    by_epoch: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for r in evaluated(run):
            by_epoch.setdefault(r.epoch, []).append(value(r))
    out = []
    for epoch in sorted(e for e, v in by_epoch.items() if len(v) == len(runs)):
        xs, ys = zip(*by_epoch[epoch], strict=True)
        out.append((epoch, statistics.fmean(xs), statistics.fmean(ys), statistics.stdev(ys) if len(ys) > 1 else 0.0))
    return out


def zero_position(values: list[float]) -> float:
    """Where 0 bytes sit on a log axis: a decade below the smallest positive value."""
    positive = [v for v in values if v > 0]
    return 10 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1e3


def bytes_axis(ax, values: list[float], axis: str = "x") -> float:
    """Make `axis` a log bytes axis with a "0 B" tick at the left edge; returns where 0 is drawn."""
    zero = zero_position(values)
    top = max([v for v in values if v > 0], default=zero * 10)
    ticks = [zero] + [10.0 ** k for k in range(int(math.log10(zero)) + 1, math.floor(math.log10(top)) + 2)]
    def label(v, _):
        return "0 B" if math.isclose(v, zero) else human_bytes(v)
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(label))
    target.set_minor_locator(matplotlib.ticker.NullLocator())
    (ax.axvline if axis == "x" else ax.axhline)(zero * 3, color="0.6", linestyle=(0, (1, 3)), linewidth=1)
    return zero


def short_bytes(n: float) -> str:
    """1e5 -> '100 kB' (tick labels: no decimals unless needed)."""
    return si(n, "B")


def finish(fig, ax, path: str, legend: bool = True) -> None:
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, bbox_inches="tight", dpi=100)
    plt.close(fig)


def target_line(ax, target: float | None) -> None:
    if target is not None:
        ax.axhline(target, color="0.3", linestyle="--", linewidth=1, label=f"target {target:.4f}")


def accuracy(groups: dict[str, list[SummaryRow]], key: str, xlabel: str, target: float | None, path: str,
             metric: Metric = ACCURACY) -> None:
    """The mean validation figure of the workload's metric (band: ± sd over seeds) against epoch, bytes
    per worker or train seconds."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    x_of = {"epoch": lambda r: r.epoch, "bytes": lambda r: r.bytes_sent_per_worker, "time": lambda r: r.train_s}[key]
    curves = {label: per_epoch(runs, lambda r: (x_of(r), r.value(metric.val_key))) for label, runs in groups.items()}
    zero = bytes_axis(ax, [p[1] for c in curves.values() for p in c]) if key == "bytes" else None
    for i, (label, points) in enumerate(curves.items()):
        if not points:
            continue
        xs = [zero if zero is not None and x <= 0 else x for _, x, _, _ in points]
        ys, sds = [p[2] for p in points], [p[3] for p in points]
        line = ax.plot(xs, ys, label=label, markersize=4, linewidth=1.4, **style(i))[0]
        if any(sds):
            ax.fill_between(xs, [y - s for y, s in zip(ys, sds, strict=True)], [y + s for y, s in zip(ys, sds, strict=True)],
                            color=line.get_color(), alpha=0.15, linewidth=0)
    if key == "epoch":
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    target_line(ax, target)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"validation {metric.name} (mean over seeds)" + ("" if metric.higher_is_better else "; lower is better"))
    finish(fig, ax, path)


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool = True) -> list[tuple[float, float]]:
    """The points no other point beats on both fewer bytes and a better figure, by bytes."""
    sign = 1.0 if higher_is_better else -1.0
    front, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (p[0], -sign * p[1])):
        if sign * y > best:
            front.append((x, y))
            best = sign * y
    return front


def pareto(rows: list[TableRow], target: float | None, path: str) -> None:
    """The final validation figure (± sd) against bytes sent per worker, one point per label."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    metric = rows[0].metric if rows else ACCURACY
    drawn = [(i, r, r.val, r.bytes) for i, r in enumerate(rows) if r.val is not None and r.bytes is not None]
    zero = bytes_axis(ax, [sent.mean for _, _, _, sent in drawn])
    points = []
    for i, r, val, sent in drawn:
        x = sent.mean if sent.mean > 0 else zero
        s = style(i)
        ax.errorbar([x], [val.mean], yerr=[val.sd or 0.0], color=s["color"], marker=s["marker"],
                    markersize=7, capsize=3, linestyle="none", label=r.label)
        points.append((x, val.mean))
        ax.annotate(r.label, (x, val.mean), xytext=(6, 4), textcoords="offset points", fontsize=7,
                    color=s["color"])
    front = pareto_front(points, metric.higher_is_better)
    if len(front) > 1:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="0.5", linewidth=1,
                linestyle="--", label="Pareto front", zorder=0)
    target_line(ax, target)
    ax.set_xlabel("bytes sent per worker (whole run)")
    ax.set_ylabel(f"final validation {metric.name}" + ("" if metric.higher_is_better else " (lower is better)"))
    finish(fig, ax, path)


def nothing(ax, why: str) -> None:
    """Say in the plot why it is empty (every run failed or diverged, nothing reached the target)."""
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.3")
    ax.set_yticks([])


def link_sweep(curves: dict[str, list[float | None]], rates: list[float], classes: dict[str, float],
               ylabel: str, path: str) -> None:
    """Projected seconds (to target) against link rate, log-log, one curve per label; labels whose
    curve is empty (never reach the target) are named in the legend."""
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for i, (label, secs) in enumerate(curves.items()):
        pts = [(r, s) for r, s in zip(rates, secs, strict=True) if s is not None]
        s = style(i)
        if pts:
            ax.plot(*zip(*pts, strict=True), label=label, markevery=max(len(pts) // 8, 1), markersize=5, linewidth=1.4, **s)
        else:
            ax.plot([], [], label=f"{label} (never reaches target)", color=s["color"], marker=s["marker"],
                    linestyle="none")
    ax.set_xscale("log")
    ax.set_xlim(min(rates), max(rates))
    if any(v for secs in curves.values() for v in secs if v):  # a log axis needs a positive value
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_seconds_label))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_seconds_label))
    else:
        nothing(ax, "no method reaches the target (see the table's status column)")
    for rate in classes.values():
        ax.axvline(rate, color="0.75", linewidth=0.8, zorder=0)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _rate_label(v)))
    ax.set_xlabel("link rate per worker (log)")
    ax.set_ylabel(ylabel)
    finish(fig, ax, path)


def _seconds_label(v: float, _=None) -> str:
    """Plain numbers on a log seconds axis, only at 1, 2 and 5 times a power of ten."""
    lead = v / 10 ** math.floor(math.log10(v)) if v > 0 else 0
    return f"{v:g}" if any(math.isclose(lead, d) for d in (1, 2, 5)) else ""


def _rate_label(v: float) -> str:
    return si(v, "bit/s", prefixes="kmg")


def tuning(panels: dict[str, list[tuple[float, float, str, bool]]], metric: Metric, title: str, path: str) -> None:
    """One method's trials: the validation figure against each tuned field's values, a panel per field (a
    log axis when the values span 10x or more). A panel's points are (value, figure, status, chosen):
    finished trials filled, pruned ones hollow at the figure they were stopped at, the chosen one a star."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.0, 4.0), sharey=True, squeeze=False)
    for ax, (field, points) in zip(axes[0], panels.items(), strict=True):
        _tuning_panel(ax, field, points)
    axes[0][0].set_ylabel(f"validation {metric.name}" + ("" if metric.higher_is_better else " (lower is better)"))
    fig.suptitle(title, fontsize=9)
    for ax in axes[0][:-1]:
        ax.grid(alpha=0.3)
    finish(fig, axes[0][-1], path)


def _tuning_panel(ax, field: str, points: list[tuple[float, float, str, bool]]) -> None:
    kinds = [("ok", "finished", {"marker": "o", "color": "C0"}),
             ("pruned", "pruned (figure when stopped)", {"marker": "o", "facecolors": "none", "edgecolors": "C1"})]
    for status, name, look in kinds:
        shown = [(x, y) for x, y, state, _ in points if state == status]
        if shown:
            ax.scatter([x for x, _ in shown], [y for _, y in shown], s=36, label=name, **look)  # type: ignore[arg-type]
    chosen = [(x, y) for x, y, _, c in points if c]
    if chosen:
        ax.scatter([x for x, _ in chosen], [y for _, y in chosen], s=180, marker="*", color="C3", label="chosen",
                   zorder=3)
    xs = [x for x, *_ in points]
    if xs and min(xs) > 0 and max(xs) >= 10 * min(xs):
        ax.set_xscale("log")
    ax.set_xlabel(field)


def distill(timelines: list[tuple[str, list[dict]]], path: str) -> None:
    """EDL-Dist's rank 0 over time, one line per run: the unused soft labels its reader holds (top) and
    the teachers it holds (bottom)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True)
    for label, points in timelines:
        ts = [p["t"] for p in points]
        top.plot(ts, [p["buffer"] for p in points], label=label, linewidth=1)
        bottom.step(ts, [p["teachers"] for p in points], where="post", label=label)
    top.set_ylabel("unused soft labels (batches)")
    bottom.set_ylabel("teachers held")
    bottom.set_ylim(bottom=0, top=max((p["teachers"] for _, pts in timelines for p in pts), default=1) + 1)
    bottom.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bottom.set_xlabel("time since the reader started (s), rank 0")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
