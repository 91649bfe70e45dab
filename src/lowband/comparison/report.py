"""A comparison's report, report.md (PNG files beside it) and report.html: which method for my link?

It answers with the comparison table (lowband.comparison.table: seeds pooled as mean ± sd, one target:
the given one or Allreduce's mean final validation accuracy) and, from each run's compute
seconds and messages, the projected training time to the target on links from 1 mbit/s to
10 gbit/s (lowband.comparison.projection), with a sentence per link class naming the fastest method and the
one that sends the fewest bytes. Plots (lowband.comparison.plots): projected seconds to target
against link rate, final validation accuracy against bytes per worker (Pareto), and validation
accuracy against epoch, bytes and training time. When the comparison tuned (tuning.csv), the
values tried, each method's trials and a plot of them (lowband.comparison.tuning_report). Where a
run used EDL-Dist teacher servers, one more
plot: its rank 0's soft-label buffer and teachers held over time. Several comparison directories
can be overlaid, their labels prefixed by names given with `labels` (default: directory names).
This module puts the report together; its figures are lowband.comparison.report_figures', its sentences
lowband.comparison.report_words'.
"""

from __future__ import annotations

import os

from lowband.atomic import write_text_atomic
from lowband.comparison import coverage, plots, projection, report_html, table, tuning_report
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.report_figures import (
    PLOTS,
    caps,
    check_target,
    dedicated,
    distill_timelines,
    goal_epochs,
    load_runs,
    prefixes,
    reference,
    spent,
    sweep,
)
from lowband.comparison.report_words import compute_note, facts, how_projected, link_sentences, measured_note, nothing_finished
from lowband.comparison.scale import pool_note, scale_note
from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import TableRow

__all__ = ["build", "verdict", "load_runs", "check_target"]

def build(folders: list, out: str | None = None, target: float | None = None,
          labels: list[str] | None = None, latency_s: float = 0.0) -> str:
    """Write report.md, report.html and the plots into `out` (default: the first folder); returns report.md."""
    folders = [ComparisonDir.of(f) for f in folders]  # each comparison's directory value, its plan read once
    out = os.fspath(out or folders[0])
    os.makedirs(out, exist_ok=True)
    runs = load_runs(folders, labels)
    check_target(target, table.metric_of(runs))
    rows, target, why = table.rows(runs, target, caps(folders), reference(folders, labels))
    groups = table.groups(runs)
    md = ["# lowband comparison", "", *[f"- {f}" for f in facts(runs, folders, target, why)], ""]
    md += answer(rows, groups, target, latency_s, out, caps(folders)) + [""]
    metric = table.metric_of(runs)
    md += ["## Results", "", (f"Mean ± sd over seeds; {metric.name} of the final model, validation split unless "
           f"marked test; `to target` = first epoch at which the mean validation {metric.name} reaches the target; "
           "`seconds to target` as measured here, `dedicated s to target` for dedicated machines."), ""]
    md += table.markdown(rows) + [""]
    names = prefixes(folders, labels)
    tuning = tuning_report.section(tuning_report.load_tuning(folders, names), out, coverage.spaces(folders, names))
    md += ["## Tuning", "", *tuning_report.seeds_said(folders), "", *tuning, ""] if tuning else []
    md += ["## Plots", "", *plot_sections(runs, rows, groups, target, out)]
    folder = ComparisonDir.of(out)
    write_text_atomic(folder.report_path("md"), "\n".join(md) + "\n")
    report_html.write_html(folder.report_path("html"), md, out)
    return folder.report_path("md")


def answer(rows: list[TableRow], groups: dict[str, list[SummaryRow]], target: float | None, latency_s: float,
           out: str, cap: float | None = None) -> list[str]:
    """The section that answers "which method for my link": sentences and the link-rate plot."""
    goals = goal_epochs(rows, groups, target)
    rates = projection.rates()
    on_dedicated = dedicated([run for g in groups.values() for run in g])
    ylabel = "projected seconds to target" if target is not None else "projected seconds to finish training"
    plots.link_sweep(sweep(groups, goals, rates, latency_s, on_dedicated), rates, projection.LINK_CLASSES,
                     ylabel + (" (dedicated machines)" if on_dedicated else ""), ComparisonDir.of(out).plot_path("time_link"))
    return ["## Which method for my link", "", *nothing_finished(rows),
            *link_sentences(rows, groups, goals, latency_s, target is not None, on_dedicated,
                            spent(rows) if cap is not None else None),
            *compute_note(rows, cap), *scale_note([r for g in groups.values() for r in g]),
            *pool_note([r for g in groups.values() for r in g]), "",
            how_projected(on_dedicated, latency_s),
            *measured_note(rows, groups, goals, latency_s, on_dedicated), "", "![time_link](time_link.png)"]


def verdict(folders: list, target: float | None = None, latency_s: float = 0.0) -> list[str]:
    """The report's answer in sentences, for the console: the target, then one sentence per link class."""
    folders = [ComparisonDir.of(f) for f in folders]
    runs = load_runs(folders)
    rows, target, why = table.rows(runs, target, caps(folders), reference(folders))
    groups = table.groups(runs)
    goals = goal_epochs(rows, groups, target)
    on_dedicated = dedicated(runs)
    head = "Which method for my link" + (" (dedicated machines: each worker's step measured alone, plus transfer "
                                          "time)" if on_dedicated else " (from the seconds measured here)") + ":"
    cap = caps(folders)
    return [head, *link_sentences(rows, groups, goals, latency_s, target is not None, on_dedicated,
                                  spent(rows) if cap is not None else None), *compute_note(rows, cap),
            *scale_note(runs), *pool_note(runs)]


def plot_sections(runs: list[SummaryRow], rows: list[TableRow], groups: dict[str, list[SummaryRow]], target: float | None,
          out: str) -> list[str]:
    plots.pareto(rows, target, ComparisonDir.of(out).plot_path("pareto"))
    names = ["pareto"]
    for name, key, xlabel in PLOTS:
        plots.accuracy(groups, key, xlabel, target, ComparisonDir.of(out).plot_path(name), table.metric_of(runs))
        names.append(name)
    timelines = distill_timelines(runs)
    if timelines:
        plots.distill(timelines, ComparisonDir.of(out).plot_path("distill"))
        names.append("distill")
    return [f"![{name}]({name}.png)" for name in names]
