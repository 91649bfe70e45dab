"""A comparison's figures, for its report (lowband.comparison.report) and the console's verdict: the runs
read back from each comparison directory (summary.csv, each run's records and config), the reference and
the target budget's cap from each plan, and time projected onto other links (lowband.comparison.projection)
for dedicated machines or from the seconds measured here. Numbers only; the sentences are
lowband.comparison.report_words'.
"""

from __future__ import annotations

import os

from lowband import config as C
from lowband.comparison import projection, table
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.summary import SummaryRow
from lowband.comparison.table import TableRow
from lowband.data.metric import ACCURACY, BITS_PER_BYTE, Metric, metric_for
from lowband.errors import ConfigError, UsageError
from lowband.net.links import LinkSpec
from lowband.run.metrics import read_metrics
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
        runs += [load_run(row, folder, prefix) for row in ComparisonDir.of(folder).read_summary()]
    return runs


def reference(folders: list[str], labels: list[str] | None = None) -> str | None:
    """The reference label of the first comparison whose plan names one, with that folder's prefix (None:
    the table takes Allreduce's)."""
    for folder, prefix in zip(folders, prefixes(folders, labels), strict=True):
        label = ComparisonDir.of(folder).reference()
        if label is not None:
            return prefix + label
    return None


def caps(folders: list[str]) -> float | None:
    """The target budget's FACTOR of the first comparison that has one (None: no target budget)."""
    return next((c for c in (ComparisonDir.of(f).cap() for f in folders) if c is not None), None)


def spent(rows: list[TableRow]) -> dict[str, float]:
    """Per label that reached the target: its training samples to target over the reference's
    samples in its whole run, the run whose final figure is the target; {} without a reference."""
    ref = next((r for r in rows if r.is_reference and r.samples is not None), None)
    if ref is None or ref.samples is None or not ref.samples.mean:
        return {}
    return {r.label: r.samples_to_target / ref.samples.mean for r in rows if r.samples_to_target is not None}


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


def bytes_at_goal(row: TableRow | None, groups: dict[str, list[SummaryRow]], goals: dict[str, int | None]) -> float:
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


def check_target(target: float | None, metric) -> None:
    """A given target must be a value of the runs' metric: an accuracy in (0, 1], a loss above 0."""
    if target is None:
        return
    if metric.higher_is_better and not 0 < target <= 1:
        raise UsageError(f"--target={target:g} is invalid: these runs report accuracy; give one in (0, 1]")
    if not metric.higher_is_better and not target > 0:
        raise UsageError(f"--target={target:g} is invalid: these runs report {metric.name}; give a loss above 0")
