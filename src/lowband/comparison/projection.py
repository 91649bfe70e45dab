"""Project a finished run's training time onto another link, with the modelled link's own arithmetic.

A run's metrics records carry, per epoch, the seconds the training loop took (`time.epoch_train_s`,
with `compute_s` inside it) and, per tag, the cumulative bytes sent per worker, the number of
calls and the bytes on each call's busiest link (`wire`: an exchange with two peers sends on two
links at once). An epoch's traffic is the difference of those counters between records, over the tags that
move during training (not the bookkeeping tags, nor "init", sent before the first epoch).

On a link L the epoch is projected to take

    base - comm + max(comm, L.seconds(bytes, messages))   (LinkSpec.seconds: bytes * 8 / rate + messages * latency)

where `base` is what the epoch took without the link's transfer time: the measured epoch minus the
transfer time of the link it was measured on (nothing for an unlimited run), never below its
compute seconds; and `comm` the communication seconds inside it (`time.comm_s`, less that
transfer time): on a slow link the exchange the backend was doing anyway overlaps the transfer,
so the two are not added (records without `comm_s` project as base + transfer). Compute that
overlaps the transfer (DDP's buckets during the backward pass, gossip's posted exchanges) is not
credited, so for those methods the projection stays an upper bound.

For dedicated machines (`dedicated_*`) the measured seconds are set aside: every worker is charged
the step time measured for one worker alone (lowband.comparison.calibrate) for each optimizer step
it took, plus the link's transfer time for the bytes and messages it counted, one after the other.
That is the time the run would take if each worker had a machine of its own; `single` is one such
machine taking all its steps.

With sites (lowband.net.sites) L is the link between sites, and a tag is charged
only when some rank's bytes of it crossed a site boundary (`inter` in `bytes_total`); it is then
charged in full, as the ranks wait for the slowest (crossing) edge of a synchronous exchange. A tag
kept inside sites (a codistillation group's Allreduce) is left on the measured intra-site link.
"""

from __future__ import annotations

from itertools import accumulate

from lowband.net.links import LinkSpec, parse_link
from lowband.records import EpochRecord
from lowband.units import si

#: tags not sent inside the training loop (see lowband.comm.BOOKKEEPING_TAGS, and "init")
OUTSIDE_TRAINING = frozenset({"metrics", "control", "barrier", "eval", "init"})

#: link classes the report speaks of, name -> bits per second
LINK_CLASSES = {"1 mbit": 1e6, "10 mbit": 1e7, "100 mbit": 1e8, "1 gbit": 1e9, "10 gbit": 1e10}

UNLIMITED = LinkSpec(float("inf"))


def rates(lo: float = 1e6, hi: float = 1e10, per_decade: int = 8) -> list[float]:
    """Link rates (bit/s) evenly spaced on a log axis from `lo` to `hi`, both included."""
    from math import log10

    n = round(log10(hi / lo) * per_decade)
    return [lo * (hi / lo) ** (i / n) for i in range(n + 1)]


def _training_counters(record: EpochRecord) -> tuple[float, float]:
    """(bytes on the busiest link, calls) per worker, cumulative, over the tags sent while training.

    A call to several peers puts its bytes on one link per peer, in parallel: the record's `wire`
    counts the busiest link's share; records without it fall back to all bytes sent (one link)."""
    tags = [v for tag, v in record.bytes.items() if tag not in OUTSIDE_TRAINING and _crossed(record, tag)]
    wire = sum(v.get("wire", v.get("sent", 0.0)) for v in tags)
    return wire, sum(v.get("calls", 0.0) for v in tags if v.get("sent"))


def _crossed(record: EpochRecord, tag: str) -> bool:
    """True when some rank's bytes of `tag` crossed a site boundary (records without `inter`: always)."""
    total = record.bytes_total.get(tag) or record.bytes[tag]
    return "inter" not in total or total["inter"] > 0


def traffic(records: list[EpochRecord]) -> list[tuple[float, float]]:
    """Per epoch record: (bytes on the busiest link, messages) per worker during that epoch.

    Records written before calls were counted give 0 messages: latency is then not projected."""
    out, before = [], (0.0, 0.0)
    for record in records:
        now = _training_counters(record)
        out.append((max(now[0] - before[0], 0.0), max(now[1] - before[1], 0.0)))
        before = now
    return out


def epoch_seconds(records: list[EpochRecord], link: LinkSpec, measured_on: LinkSpec = UNLIMITED) -> list[float]:
    """Projected training seconds of every epoch on `link`, from records measured on `measured_on`."""
    return [_epoch_on(record.time, sent, messages, link, measured_on)
            for record, (sent, messages) in zip(records, traffic(records), strict=True)]


def _epoch_on(t: dict, sent: float, messages: float, link: LinkSpec, measured_on: LinkSpec) -> float:
    """One epoch: what it took without its link's transfer time (never below its compute), with the
    communication seconds it spent then replaced by max(those seconds, the new link's transfer time):
    a transfer runs while the backend's own exchange does, not after it."""
    then = measured_on.seconds(sent, messages)
    compute = t.get("compute_s", 0.0)
    base = max(t["epoch_train_s"] - then, compute)
    comm = min(max(t.get("comm_s", 0.0) - then, 0.0), base - compute)
    return base - comm + max(comm, link.seconds(sent, messages))


def seconds_through(records: list[EpochRecord], epoch: int, link: LinkSpec,
                    measured_on: LinkSpec = UNLIMITED) -> float | None:
    """Projected training seconds from the start through `epoch` (None: the run has no such epoch)."""
    total = list(accumulate(epoch_seconds(records, link, measured_on)))
    return next((s for r, s in zip(records, total, strict=True) if r.epoch == epoch), None)


def steps_per_epoch(records: list[EpochRecord]) -> list[float]:
    """Optimizer steps each worker took in every epoch (records' cumulative `steps`)."""
    out, before = [], 0.0
    for record in records:
        now = float(record.steps or 0.0)
        out.append(max(now - before, 0.0))
        before = now
    return out


def dedicated_epoch_seconds(records: list[EpochRecord], step_s: float, link: LinkSpec = UNLIMITED) -> list[float]:
    """Per epoch: steps x `step_s` (one worker's step measured alone) plus `link`'s transfer time."""
    return [steps * step_s + link.seconds(sent, messages)
            for steps, (sent, messages) in zip(steps_per_epoch(records), traffic(records), strict=True)]


def dedicated_through(records: list[EpochRecord], epoch: int, step_s: float | None,
                      link: LinkSpec | None = None) -> float | None:
    """Dedicated-machine seconds from the start through `epoch` on `link` (default unlimited); None
    without a calibrated step time or without that epoch."""
    if step_s is None:
        return None
    total = list(accumulate(dedicated_epoch_seconds(records, step_s, link or UNLIMITED)))
    return next((s for r, s in zip(records, total, strict=True) if r.epoch == epoch), None)


def run_link(rate: str) -> LinkSpec:
    """The link a run was measured on, from its config's link.rate ("" or "unlimited": none)."""
    return parse_link(rate)


def link_name(rate_bps: float) -> str:
    """1e7 -> '10 mbit'."""
    return si(rate_bps, "bit", prefixes="kmg")
