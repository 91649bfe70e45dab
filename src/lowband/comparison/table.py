"""The one comparison table, which `compare` prints and `report` writes: a row per label, seeds pooled.

Input: runs (lowband.comparison.summary.SummaryRow: `label`, `method`, `workers`, `status` and
`records`, its metrics records in epoch order); output: a `TableRow` per label. Runs sharing a
label are the seeds of one configuration; figures are their mean ± sample standard deviation.

The figures read the workload's metric (lowband.data.metric, each run's `metric`): validation
accuracy for a classifier (higher is better), validation bits per byte for a language model (lower
is better, reached within a relative margin). One reference, the target: a number when the user
gives one, else the mean final validation figure of the reference's runs (the plan's reference: the
suite's `target` method, Allreduce by default). A label "reaches" it at the first epoch at which its
mean validation figure over seeds reaches the target; the epochs, bytes and seconds to target are the
seeds' means at that epoch, and the speed-up is the reference's seconds to target over the label's.
When the gap between a label's mean final validation figure and the target is smaller than its
spread, the gap is marked "within noise". Every figure that
selects (target, to-target, best) reads the validation split; the test split is reported for the
final model. `dedicated s to target` charges each worker the step time measured alone
(lowband.comparison.calibrate) per step, plus the run's link's transfer time for its bytes.
When a run has sites (`sites` > 1: lowband.net.sites), an "inter-site/worker" column shows the
bytes per worker that crossed a site boundary beside all bytes sent.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lowband.comparison.plan import REFERENCE, parse_spec
from lowband.comparison.projection import dedicated_through
from lowband.comparison.space import show
from lowband.comparison.summary import SummaryRow
from lowband.data.metric import ACCURACY, Metric
from lowband.errors import ConfigError
from lowband.records import EpochRecord
from lowband.run.metrics import human_bytes
from lowband.units import si


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over seeds (sd None with one value)."""

    mean: float
    sd: float | None
    n: int

    @staticmethod
    def of(values: Sequence[float | None]) -> Stat | None:
        known = [float(v) for v in values if v is not None]
        if not known:
            return None
        return Stat(statistics.fmean(known), statistics.stdev(known) if len(known) > 1 else None, len(known))

    def show(self, fmt) -> str:
        return fmt(self.mean) + ("" if self.sd is None else f" ± {fmt(self.sd)}")


def evaluated(run: SummaryRow) -> list[EpochRecord]:
    return [r for r in run.records if r.val_acc is not None]


def groups(runs: list[SummaryRow]) -> dict[str, list[SummaryRow]]:
    """Runs by label, labels in order of first appearance."""
    out: dict[str, list[SummaryRow]] = {}
    for run in runs:
        out.setdefault(run.label, []).append(run)
    return out


def final(runs: list[SummaryRow], key: str | Callable[[EpochRecord], float | None]) -> Stat | None:
    """A figure of each run's last evaluated record, over the runs that have one: the field a metric
    names (`key`, e.g. its val_key) or what a function reads."""
    read = key if callable(key) else (lambda r: r.value(key))
    return Stat.of([read(evaluated(r)[-1]) for r in runs if evaluated(r)])


def metric_of(runs: Sequence[SummaryRow | TableRow]) -> Metric:
    """The workload's metric of these runs (the first run's; accuracy for none)."""
    return runs[0].metric if runs else ACCURACY


def mean_curve(runs: list[SummaryRow], key: str | None = None) -> list[tuple[int, float]]:
    """(epoch, mean of `key` over the runs) at every epoch all of them evaluated (`key` default: the
    metric's validation figure)."""
    key = key or metric_of(runs).val_key
    done = [{r.epoch: r.value(key) for r in evaluated(run) if r.value(key) is not None} for run in runs]
    done = [d for d in done if d]
    if not done:
        return []
    common = sorted(set.intersection(*(set(d) for d in done)))
    return [(e, statistics.fmean(d[e] for d in done)) for e in common]


def hit_epoch(runs: list[SummaryRow], target: float | None) -> int | None:
    """The first epoch at which the runs' mean validation figure reaches `target` (None: never)."""
    if target is None:
        return None
    metric = metric_of(runs)
    return next((e for e, value in mean_curve(runs) if metric.reaches(value, target)), None)


def at_epoch(runs: list[SummaryRow], epoch: int, value) -> float | None:
    """Mean over the runs of `value(record)` for their record of `epoch`."""
    stat = Stat.of([value(r) for run in runs for r in run.records if r.epoch == epoch])
    return stat.mean if stat else None


def reference_label(runs: list[SummaryRow], label: str | None = None) -> str | None:
    """The reference's label: `label` (the plan's, lowband.comparison.folder.ComparisonDir.reference) when
    the runs hold it, else (an older comparison without one) the first Allreduce label."""
    if label is not None and any(r.label == label for r in runs):
        return label
    return next((r.label for r in runs if r.method == REFERENCE), None)


def reference(runs: list[SummaryRow], target: float | None, label: str | None = None) -> tuple[float | None, str]:
    """(target, why): the given number, else the reference's (`label`'s) mean final validation figure."""
    if target is not None:
        return target, "given"
    key = metric_of(runs).val_key
    label = reference_label(runs, label)
    ref = next((g for name, g in groups(runs).items() if name == label and final(g, key)), None)
    if ref is None:
        return None, (f"none (the {label} runs diverged or failed)" if label else
                      "none (no reference run and no target given)")
    stat = final(ref, key)
    assert stat is not None  # ref was chosen for having one
    seeds = f" over {stat.n} seeds" if stat.n > 1 else ""
    return stat.mean, f"mean final validation {metric_of(runs).name} of {ref[0].label}{seeds}"


@dataclass
class TableRow:
    """One label of the table: its seeds pooled (mean ± sd), and where it stands against the target."""

    label: str
    method: str
    workers: int
    seeds: int
    status: str  # ok, or how many seeds diverged or failed
    metric: Metric
    val: Stat | None  # the metric's final validation figure
    test: Stat | None
    target: float | None
    val_acc: Stat | None  # accuracy, whatever the metric (a language model's next-byte accuracy)
    test_acc: Stat | None
    val_acc_L: Stat | None
    gap: float | None  # val - target
    within_noise: bool
    samples: Stat | None
    bytes: Stat | None  # sent per worker
    sites: int
    inter: Stat | None  # inter-site bytes per worker
    train_s: Stat | None
    epochs_to_target: int | None
    bytes_to_target: float | None
    seconds_to_target: float | None
    dedicated_to_target: float | None
    speedup: float | None = None  # the reference's seconds to target over this label's
    samples_to_target: float | None = None  # training samples over all workers, mean over seeds
    never: str = "never"  # what a to-target cell says when the label never reached it ("never within 4x")
    reference: str | None = None  # the comparison's reference label (the target's and the speed-ups' base)
    retuned: str = ""  # the spec's options that tuning replaced, as they ran ('tau=32')

    @property
    def is_reference(self) -> bool:
        return self.label == self.reference


def row(label: str, runs: list[SummaryRow], target: float | None) -> TableRow:
    metric = metric_of(runs)
    val, hit = final(runs, metric.val_key), hit_epoch(runs, target)
    last = [r.records[-1] for r in runs if r.records]
    gap = None if val is None or target is None else val.mean - target
    return TableRow(
        label=label, method=runs[0].method, workers=runs[0].workers, seeds=len(runs), status=status(runs),
        metric=metric, val=val, test=final(runs, metric.test_key), target=target,
        val_acc=final(runs, lambda r: r.val_acc), test_acc=final(runs, lambda r: r.test_acc),
        val_acc_L=final(runs, lambda r: r.val_acc_L),
        gap=gap, within_noise=val is not None and gap is not None and val.sd is not None and abs(gap) < val.sd,
        samples=Stat.of([r.samples for r in last]), bytes=Stat.of([r.bytes_sent_per_worker for r in last]),
        sites=max(r.sites for r in runs), inter=Stat.of([r.inter_or_sent for r in last]),
        train_s=Stat.of([r.train_s for r in last]), epochs_to_target=hit,
        bytes_to_target=None if hit is None else at_epoch(runs, hit, lambda r: r.bytes_sent_per_worker),
        seconds_to_target=None if hit is None else at_epoch(runs, hit, lambda r: r.train_s),
        dedicated_to_target=None if hit is None else dedicated_at(runs, hit),
        samples_to_target=None if hit is None else at_epoch(runs, hit, lambda r: r.samples),
        retuned=retuned(label, runs[0].tuned))


def retuned(label: str, tuned: str | None) -> str:
    """The spec's own options that tuning replaced, as they ran ('tau=32' for diloco:tau=16 tuned over
    method.tau and run at 32), so the table's label says what ran; '' when tuning changed none of them."""
    try:
        options = {key: show(value) for key, value in parse_spec(label)[1].items()}  # as Run.tuned writes them
    except ConfigError:  # a label no plan made (an older summary's): nothing to compare
        return ""
    chosen = dict(item.split("=", 1) for item in (tuned or "").split() if "=" in item)
    return " ".join(f"{key}={value}" for key, value in ((k.removeprefix("method."), v) for k, v in chosen.items()
                                                        if k.startswith("method."))
                    if key in options and options[key] != value)


def status(runs: list[SummaryRow]) -> str:
    """'ok', or how many of the seeds diverged and how many failed otherwise ('1 of 3 diverged')."""
    diverged = sum(r.status == "diverged" for r in runs)
    failed = sum(r.status not in ("ok", "diverged") for r in runs)
    parts = [f"{n} of {len(runs)} {word}" for n, word in ((diverged, "diverged"), (failed, "failed")) if n]
    return "; ".join(parts) or "ok"


def dedicated_at(runs: list[SummaryRow], epoch: int) -> float | None:
    """Mean over seeds of the dedicated-machine seconds through `epoch` on each run's own link (None:
    a run has no calibrated step time)."""
    found = [dedicated_through(r.records, epoch, r.step_s, r.link) for r in runs]
    known = [s for s in found if s is not None]
    return sum(known) / len(known) if known and len(known) == len(found) else None


def rows(runs: list[SummaryRow], target: float | None = None, cap: float | None = None,
         reference_of: str | None = None) -> tuple[list[TableRow], float | None, str]:
    """(one row per label, the target (in the runs' metric), why that target); `cap`: a target budget's
    FACTOR, which a label that never reached the target was stopped at ("never within 4x"); `reference_of`:
    the reference's label (the plan's; default: Allreduce's), the target and the speed-ups' base."""
    label = reference_label(runs, reference_of)
    target, why = reference(runs, target, label)
    out = [row(name, group, target) for name, group in groups(runs).items()]
    for r in out:
        r.never = "never" if cap is None else f"never within {cap:g}x"
        r.reference = label
    ref = next((r for r in out if r.is_reference and r.seconds_to_target is not None), None)
    for r in out:
        if ref is not None and ref.seconds_to_target is not None and r.seconds_to_target is not None:
            r.speedup = ref.seconds_to_target / max(r.seconds_to_target, 1e-9)
    return out, target, why


# ---- rendering ---------------------------------------------------------------------------------
def _acc(s: Stat | None) -> str:
    return "-" if s is None else s.show(lambda v: f"{v:.4f}")


def _gap(r: TableRow) -> str:
    if r.gap is None or r.val is None or r.target is None:
        return "-"
    return r.metric.gap(r.val.mean, r.target) + (" (within noise)" if r.within_noise else "")


def _count(n: float) -> str:
    return si(n, "", ".2f", plain=".0f", sep="")


def _never(r: TableRow, v, fmt) -> str:
    return r.never if v is None else fmt(v)


def _stat(s: Stat | None, fmt) -> str:
    return "-" if s is None else fmt(s)


INTER = "inter-site/worker"
SIDE_ACC = "val acc"  # a language model's next-byte accuracy, beside its bits per byte
DEDICATED = "dedicated s to target"
SAMPLES_TO = "samples to target"  # shown under a target budget, where methods train for different lengths
COLUMNS: list[tuple[str, Callable[[TableRow], str]]] = [
    ("method", lambda r: r.label + (f" (tuned: {r.retuned})" if r.retuned else "")),
    ("seeds", lambda r: str(r.seeds)),
    ("workers", lambda r: str(r.workers)),
    ("val METRIC", lambda r: _acc(r.val)),
    ("test METRIC", lambda r: _acc(r.test)),
    (SIDE_ACC, lambda r: _acc(r.val_acc)),
    ("vs target", _gap),
    ("samples", lambda r: _stat(r.samples, lambda s: _count(s.mean))),
    ("sent/worker", lambda r: _stat(r.bytes, lambda s: human_bytes(s.mean))),
    (INTER, lambda r: _stat(r.inter, lambda s: human_bytes(s.mean))),
    ("train s", lambda r: _stat(r.train_s, lambda s: s.show(lambda v: f"{v:.1f}"))),
    ("epochs to target", lambda r: _never(r, r.epochs_to_target, str)),
    (SAMPLES_TO, lambda r: _never(r, r.samples_to_target, _count)),
    ("bytes to target", lambda r: _never(r, r.bytes_to_target, human_bytes)),
    ("seconds to target", lambda r: _never(r, r.seconds_to_target, lambda v: f"{v:.1f}")),
    (DEDICATED, lambda r: _never(r, r.dedicated_to_target, lambda v: f"{v:.1f}")),
    ("speed-up vs REFERENCE", lambda r: "-" if r.speedup is None else f"{r.speedup:.2f}x"),
]


def columns(table: list[TableRow]) -> list:
    """The columns shown, titled in the metric's word: the inter-site bytes only when some row's runs had
    more than one site; accuracy beside a language model's bits per byte; the dedicated-machine seconds
    when some run has a calibrated step time; the samples to target under a target budget."""
    sites = any(r.sites > 1 for r in table)
    metric = metric_of(table)
    dedicated = any(r.dedicated_to_target is not None for r in table)
    capped = any(r.never != "never" for r in table)
    reference = next((r.reference for r in table if r.reference), "reference")
    shown = [(title.replace("METRIC", metric.short).replace("REFERENCE", reference), show) for title, show in COLUMNS
             if (sites or title != INTER) and (metric is not ACCURACY or title != SIDE_ACC)
             and (dedicated or title != DEDICATED) and (capped or title != SAMPLES_TO)]
    return shown


def head(table: list[TableRow]) -> list[str]:
    failed = any(r.status != "ok" for r in table)
    return [title for title, _ in columns(table)] + (["status"] if failed else [])


def cells(r: TableRow, width: int, cols: list | None = None) -> list[str]:
    """Row `r`'s cells under `cols` (default: the columns a table of `r` alone shows)."""
    return ([show(r) for _, show in (cols or columns([r]))] + [r.status])[:width]


def markdown(table: list[TableRow]) -> list[str]:
    titles, cols = head(table), columns(table)
    return (["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
            + ["| " + " | ".join(cells(r, len(titles), cols)) + " |" for r in table])


def text(table: list[TableRow]) -> str:
    """The table as aligned plain text, for the console."""
    titles, cols = head(table), columns(table)
    body = [cells(r, len(titles), cols) for r in table]
    widths = [max(len(line[i]) for line in [titles] + body) for i in range(len(titles))]
    def line(cs):
        return "  ".join(c.ljust(w) for c, w in zip(cs, widths, strict=True)).rstrip()
    return "\n".join([line(titles), line(["-" * w for w in widths])] + [line(b) for b in body])


def describe_target(target: float | None, why: str, metric: Metric = ACCURACY) -> str:
    return metric.describe_target(target, why)
