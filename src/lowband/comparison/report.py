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
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from lowband import config as C
from lowband.atomic import write_text_atomic
from lowband.comparison import coverage, plots, projection, report_html, table, tuning_report
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.plan import REFERENCE
from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import TableRow
from lowband.data.metric import ACCURACY, BITS_PER_BYTE, Metric, metric_for
from lowband.errors import ConfigError, UsageError
from lowband.net.links import LinkSpec, parse_link
from lowband.run.metrics import human_bytes, read_metrics
from lowband.run.rundir import RunDir, warn
from lowband.training import runconfig

PLOTS = [("acc_epoch", "epoch", "epoch"), ("acc_bytes", "bytes", "bytes sent per worker"),
         ("acc_time", "time", "training time (s)")]


def prefixes(folders: list[str], labels: list[str] | None) -> list[str]:
    """What each folder's labels are prefixed with: the given names, else directory names (one folder: none)."""
    if labels is not None:
        if len(labels) != len(folders) or not all(labels):
            raise UsageError(f"--labels={','.join(labels)!r} names {len(labels)} comparisons; "
                             f"give one non-empty name per directory ({len(folders)})")
        return [f"{name}/" for name in labels]
    if len(folders) == 1:
        return [""]
    return [f"{os.path.basename(os.path.normpath(folder))}/" for folder in folders]


def read_config(run_dir: str) -> C.Config | None:
    """A run's typed config (None when missing; None and a warning when damaged or from another version)."""
    if not RunDir(run_dir).is_run():
        return None
    try:
        return runconfig.read_run_config(run_dir, "config.toml")
    except (ConfigError, UsageError) as e:
        warn(f"{run_dir}: {e}; its link is taken as unlimited")
        return None


def record_problem(record: dict) -> str | None:
    """Why a metrics record cannot be reported (None: it can)."""
    t = record.get("time")
    if not isinstance(record.get("epoch"), int):
        return "no integer epoch"
    if not isinstance(t, dict) or not isinstance(t.get("epoch_train_s"), (int, float)):
        return "no time.epoch_train_s"
    return None


def load_run(run: SummaryRow, folder: str, prefix: str) -> SummaryRow:
    """One summary.csv row with its run's records, metric and link (read from the run's directory)."""
    run_dir = run.run_dir if os.path.isabs(run.run_dir) else os.path.join(folder, os.path.basename(run.run_dir))
    config = read_config(run_dir)
    link = config.link if config else C.LinkConfig()
    run.label, run.run_dir, run.status = prefix + run.label, run_dir, run.status or "ok"
    run.step_s = run.step_s if run.step_s and run.step_s > 0 else None
    run.link_mode, run.records = link.mode, read_metrics(run_dir, check=record_problem)
    run.metric, run.link = metric_for(config.data.name) if config else metric_of_records(run), projection.run_link(link.rate)
    return run


def metric_of_records(run: SummaryRow) -> Metric:
    """The metric of a run whose config cannot be read: bits per byte when its records or row carry them."""
    from_loss = run.val_bpb is not None or any(r.val_bpb is not None for r in run.records)
    return BITS_PER_BYTE if from_loss else ACCURACY


def load_runs(folders: list[str], labels: list[str] | None = None) -> list[SummaryRow]:
    """Every run of the comparison directories (one summary.csv row each), with its metrics records."""
    runs = []
    for folder, prefix in zip(folders, prefixes(folders, labels), strict=True):
        runs += [load_run(row, folder, prefix) for row in ComparisonDir(folder).read_summary()]
    return runs


def reference(folders: list[str], labels: list[str] | None = None) -> str | None:
    """The reference label of the first comparison whose plan names one, with that folder's prefix (None:
    the table takes Allreduce's)."""
    for folder, prefix in zip(folders, prefixes(folders, labels), strict=True):
        label = ComparisonDir(folder).reference()
        if label is not None:
            return prefix + label
    return None


# ---- projection onto other links -------------------------------------------------------------
def caps(folders: list[str]) -> float | None:
    """The target budget's FACTOR of the first comparison that has one (None: no target budget)."""
    return next((c for c in (ComparisonDir(f).cap() for f in folders) if c is not None), None)


def spent(rows: list[TableRow]) -> dict[str, float]:
    """Per label that reached the target: its training samples to target over the reference's
    samples in its whole run, the run whose final figure is the target; {} without a reference."""
    ref = next((r for r in rows if r.is_reference and r.samples is not None), None)
    if ref is None or ref.samples is None or not ref.samples.mean:
        return {}
    return {r.label: r.samples_to_target / ref.samples.mean for r in rows if r.samples_to_target is not None}


def compute_note(rows: list[TableRow], cap: float | None) -> list[str]:
    """Under a target budget, one line on how much compute each method spent to reach the target."""
    ratios = spent(rows) if cap is not None else {}
    if not ratios:
        return []
    ref = next(r.label for r in rows if r.is_reference)
    never = [r.label for r in rows if r.samples_to_target is None]
    return ["", f"Compute to the target (training samples over all workers, against {ref}'s whole run, whose final "
                f"figure is the target; each method stopped there or at {cap:g}x): "
                + ", ".join(f"{label} {x:.2f}x" for label, x in ratios.items())
                + (f"; never within {cap:g}x: {', '.join(never)}" if never else "") + "."]


def dedicated(runs: list[SummaryRow]) -> bool:
    """Whether every run has a calibrated step time, so that time is projected for dedicated machines."""
    return bool(runs) and all(r.step_s for r in runs)


def projected(runs: list[SummaryRow], epoch: int | None, link: LinkSpec, on_dedicated: bool = False) -> float | None:
    """Mean over seeds of the projected training seconds through `epoch` on `link` (None: never): for
    dedicated machines (each worker's step measured alone), or from the seconds the runs measured here."""
    if epoch is None:
        return None
    if on_dedicated:
        found = [projection.dedicated_through(r.records, epoch, r.step_s, link) for r in runs]
    else:
        found = [projection.seconds_through(r.records, epoch, link, r.link or projection.UNLIMITED) for r in runs]
    secs = [s for s in found if s is not None]
    return sum(secs) / len(secs) if secs else None


def goal_epochs(rows: list[TableRow], groups: dict[str, list[SummaryRow]], target: float | None) -> dict[str, int | None]:
    """Per label, the epoch projections run to: the target's (mean curve), or without a target the last one."""
    if target is not None:
        return {r.label: r.epochs_to_target for r in rows}
    return {label: (table.mean_curve(g)[-1][0] if table.mean_curve(g) else None) for label, g in groups.items()}


def sweep(groups: dict[str, list[SummaryRow]], goals: dict[str, int | None], rates: list[float],
          latency_s: float, on_dedicated: bool = False) -> dict[str, list[float | None]]:
    return {label: [projected(g, goals[label], LinkSpec(rate, latency_s), on_dedicated) for rate in rates]
            for label, g in groups.items()}


def link_sentences(rows: list[TableRow], groups: dict[str, list[SummaryRow]], goals: dict[str, int | None],
                   latency_s: float, has_target: bool, on_dedicated: bool = False,
                   spent: dict[str, float] | None = None) -> list[str]:
    """One sentence per link class: the fastest label to target there, and the one with fewest bytes;
    with `spent` (a target budget: each label's samples to target over the reference's), what the fastest
    spent in compute when it is not the reference."""
    goal = "to target" if has_target else "to finish training"
    reach = [r for r in rows if goals[r.label] is not None]
    by_bytes = min(reach, key=lambda r: _bytes_at_goal(r, groups, goals), default=None)
    ref = next((r.label for r in reach if r.is_reference), None)
    out = []
    for name, rate in projection.LINK_CLASSES.items():
        link = LinkSpec(rate, latency_s)
        secs = {r.label: projected(groups[r.label], goals[r.label], link, on_dedicated) for r in reach}
        if not secs:
            out.append(f"At {name} no method reaches the target.")
            continue
        best = min(secs, key=lambda label: secs[label] or 0.0)
        versus = f"; {ref} {secs[ref]:.1f} s" if ref is not None and ref != best else ""
        if spent and best in spent and best != ref:
            versus += f"; {spent[best]:.2f}x {ref or 'the reference'}'s training samples"
        out.append(f"At {name} the fastest {goal} is {best} ({secs[best]:.1f} s{versus}), the fewest bytes "
                   f"{by_bytes.label if by_bytes else '-'} "
                   f"({human_bytes(_bytes_at_goal(by_bytes, groups, goals))} per worker){_team(reach, best, secs)}.")
    return out


def _team(reach: list[TableRow], best: str, secs: dict[str, float | None]) -> str:
    """When the fastest is one worker: the fastest of the methods that use all the workers, for a user
    whose data or job cannot sit on one machine ('' when the fastest already uses them, or none reaches)."""
    widest = max((r.workers for r in reach), default=1)
    if next(r.workers for r in reach if r.label == best) == widest:
        return ""
    team = min((r.label for r in reach if r.workers == widest), key=lambda label: secs[label] or 0.0)
    return f"; on all {widest} workers (when one machine cannot hold the data or the job) {team} ({secs[team]:.1f} s)"


def _bytes_at_goal(row: TableRow | None, groups: dict[str, list[SummaryRow]], goals: dict[str, int | None]) -> float:
    goal = None if row is None else goals[row.label]
    if row is None or goal is None:
        return 0.0
    value = table.at_epoch(groups[row.label], goal, lambda r: r.bytes_sent_per_worker)
    return value or 0.0


def distill_timelines(runs: list[SummaryRow]) -> list[tuple[str, list[dict]]]:
    """(label, rank 0's distill.rank0.jsonl points) for every run that has one."""
    out = []
    for run in runs:
        points = RunDir(run.run_dir).read("distill", rank=0, per_rank=True)
        if points:
            out.append((run.label, points))
    return out


def machine() -> str:
    import torch

    lines = Path("/proc/cpuinfo").read_text().splitlines() if os.path.exists("/proc/cpuinfo") else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor() or "unknown")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, GPU {gpu}, Python {platform.python_version()}"


def link_of(runs: list[SummaryRow]) -> str:
    seen = set()
    for run in runs:
        config = read_config(run.run_dir)
        if config is not None:
            link = config.link
            seen.add(f"{parse_link(link.rate).describe()} ({link.mode})" + _sites_of(run, link))
    return "; ".join(sorted(seen)) or "unknown"


def _sites_of(run: SummaryRow, link: C.LinkConfig) -> str:
    """', between 2 sites, unlimited inside' for a run with sites (lowband.net.sites), else ''."""
    if run.sites <= 1:
        return ""
    return f" between {run.sites} sites, {parse_link(link.intra).describe()} inside"


def build(folders: list[str], out: str | None = None, target: float | None = None,
          labels: list[str] | None = None, latency_s: float = 0.0) -> str:
    """Write report.md, report.html and the plots into `out` (default: the first folder); returns report.md."""
    out = out or folders[0]
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
    md += ["## Tuning", "", *tuning, ""] if tuning else []
    md += ["## Plots", "", *plot_sections(runs, rows, groups, target, out)]
    folder = ComparisonDir(out)
    write_text_atomic(folder.report_path("md"), "\n".join(md) + "\n")
    report_html.write_html(folder.report_path("html"), md, out)
    return folder.report_path("md")


def check_target(target: float | None, metric) -> None:
    """A given target must be a value of the runs' metric: an accuracy in (0, 1], a loss above 0."""
    if target is None:
        return
    if metric.higher_is_better and not 0 < target <= 1:
        raise UsageError(f"--target={target:g} is invalid: these runs report accuracy; give one in (0, 1]")
    if not metric.higher_is_better and not target > 0:
        raise UsageError(f"--target={target:g} is invalid: these runs report {metric.name}; give a loss above 0")


def facts(runs: list[SummaryRow], folders: list[str], target: float | None, why: str) -> list[str]:
    budget = budgets(folders)
    return [table.describe_target(target, why, table.metric_of(runs)), f"Machine: {machine()}", *model_facts(runs),
            *corpus_facts(runs), f"Link: {link_of(runs)}",
            *([f"Budget: {budget}"] if budget else []), f"Comparisons: {', '.join(folders)}"]


def model_facts(runs: list[SummaryRow]) -> list[str]:
    """'Model: NAME (its size or options)' of the runs (a built-in's or a user's `package.module:factory`), from
    their configs; a warning when they trained different models."""
    seen = {shown_model(cfg.model) for run in runs if run.run_dir and (cfg := read_config(run.run_dir))}
    if not seen:
        return []
    return [("Model: " if len(seen) == 1 else "Model (WARNING: the runs trained different models): ")
            + "; ".join(sorted(seen))]


def shown_model(model: C.ModelConfig) -> str:
    detail = [f"size {model.size}"] if model.name == "gpt" else []
    detail += [f"{k}={v}" for k, v in sorted((model.kwargs or {}).items())]
    return model.name + (f" ({', '.join(detail)})" if detail else "")


def corpus_facts(runs: list[SummaryRow]) -> list[str]:
    """'Text: sha256 ... (N bytes)' for language-model runs; a warning when they trained on different text."""
    seen = {(r.records[-1].corpus_sha256, r.records[-1].corpus_bytes) for r in runs
            if r.records and r.records[-1].corpus_sha256}
    if not seen:
        return []
    shown = "; ".join(f"sha256 {h} ({n:,} bytes)" for h, n in sorted(seen, key=str))
    return [("Text: " if len(seen) == 1 else "Text (WARNING: the runs trained on different text): ") + shown]


BUDGET_WORDS = {"target": "to the target: REFERENCE (the reference) ran train.epochs, every other method until its "
                          "validation figure reached REFERENCE's final one, or at most FACTOR x its samples",
                "epochs": "equal epochs over each worker's own data",
                "steps": "equal optimizer steps per worker (Allreduce's in train.epochs)",
                "samples": "equal training samples over all workers (Allreduce's in train.epochs)"}


def budgets(folders: list[str]) -> str:
    """What every method was given equally, from each comparison's plan.json (older ones: equal epochs; empty
    when a plan.json is damaged)."""
    seen = []
    for folder in folders:
        budget = ComparisonDir(folder).budget()
        if budget is None:
            return ""
        words = BUDGET_WORDS.get(budget, budget)
        seen.append(words.replace("REFERENCE", ComparisonDir(folder).reference() or REFERENCE))
    return "; ".join(dict.fromkeys(seen))


def answer(rows: list[TableRow], groups: dict[str, list[SummaryRow]], target: float | None, latency_s: float,
           out: str, cap: float | None = None) -> list[str]:
    """The section that answers "which method for my link": sentences and the link-rate plot."""
    goals = goal_epochs(rows, groups, target)
    rates = projection.rates()
    on_dedicated = dedicated([run for g in groups.values() for run in g])
    ylabel = "projected seconds to target" if target is not None else "projected seconds to finish training"
    plots.link_sweep(sweep(groups, goals, rates, latency_s, on_dedicated), rates, projection.LINK_CLASSES,
                     ylabel + (" (dedicated machines)" if on_dedicated else ""), ComparisonDir(out).plot_path("time_link"))
    return ["## Which method for my link", "", *nothing_finished(rows),
            *link_sentences(rows, groups, goals, latency_s, target is not None, on_dedicated,
                            spent(rows) if cap is not None else None),
            *compute_note(rows, cap), "", how_projected(on_dedicated, latency_s),
            *measured_note(rows, groups, goals, latency_s, on_dedicated), "", "![time_link](time_link.png)"]


def nothing_finished(rows: list[TableRow]) -> list[str]:
    """A sentence when no run finished: every one diverged or failed (each run's status says which)."""
    if any(r.status == "ok" for r in rows):
        return []
    return ["No run finished: every run diverged or failed (the table's status column; each run directory's "
            "diverged.rank*.txt or train.log says why), so there is nothing to compare.", ""]


def how_projected(on_dedicated: bool, latency_s: float) -> str:
    latency = f"{latency_s * 1e3:g} ms latency per message" if latency_s else "no latency"
    if on_dedicated:
        return ("These sentences and the plot are for dedicated machines: every worker is charged the step time "
                "measured for one worker alone (same model, batch and threads; calibration.json) for each step it "
                f"took, plus the link's transfer time for the bytes and messages it counted (bytes × 8 / rate, "
                f"{latency}); `single` is one such machine. A method's extra compute per step (a peer's "
                "forward pass, soft labels) is not charged.")
    return (f"Projected from each run's compute seconds and messages as the modelled link charges them "
            f"(bytes × 8 / rate, {latency}); the measured link's transfer time is taken out first. "
            "Methods that overlap messages with computing are projected as if they did not (an upper bound). "
            "The workers shared this machine's cores, so their compute seconds are not a dedicated machine's.")


def measured_note(rows: list[TableRow], groups: dict[str, list[SummaryRow]], goals: dict[str, int | None],
                  latency_s: float, on_dedicated: bool) -> list[str]:
    """With dedicated figures, one line on what the seconds measured here (shared cores) would have said."""
    if not on_dedicated:
        return []
    link = LinkSpec(projection.LINK_CLASSES["10 mbit"], latency_s)
    secs = {r.label: projected(groups[r.label], goals[r.label], link) for r in rows
            if goals[r.label] is not None}
    known = {k: v for k, v in secs.items() if v is not None}
    if not known:
        return []
    best = min(known, key=lambda k: known[k])
    return ["", f"From the seconds measured here instead (workers sharing {os.cpu_count()} cores), the fastest at "
                f"10 mbit would be {best} ({known[best]:.1f} s): those seconds charge each worker its neighbours' work."]


def verdict(folders: list[str], target: float | None = None, latency_s: float = 0.0) -> list[str]:
    """The report's answer in sentences, for the console: the target, then one sentence per link class."""
    runs = load_runs(folders)
    rows, target, why = table.rows(runs, target, caps(folders), reference(folders))
    groups = table.groups(runs)
    goals = goal_epochs(rows, groups, target)
    on_dedicated = dedicated(runs)
    head = "Which method for my link" + (" (dedicated machines: each worker's step measured alone, plus transfer "
                                          "time)" if on_dedicated else " (from the seconds measured here)") + ":"
    cap = caps(folders)
    return [head, *link_sentences(rows, groups, goals, latency_s, target is not None, on_dedicated,
                                  spent(rows) if cap is not None else None), *compute_note(rows, cap)]


def plot_sections(runs: list[SummaryRow], rows: list[TableRow], groups: dict[str, list[SummaryRow]], target: float | None,
          out: str) -> list[str]:
    plots.pareto(rows, target, ComparisonDir(out).plot_path("pareto"))
    names = ["pareto"]
    for name, key, xlabel in PLOTS:
        plots.accuracy(groups, key, xlabel, target, ComparisonDir(out).plot_path(name), table.metric_of(runs))
        names.append(name)
    timelines = distill_timelines(runs)
    if timelines:
        plots.distill(timelines, ComparisonDir(out).plot_path("distill"))
        names.append("distill")
    return [f"![{name}]({name}.png)" for name in names]
