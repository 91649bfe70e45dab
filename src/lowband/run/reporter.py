"""The epoch reporter: gathers what every rank measured and writes one record per epoch.

Each rank fills a `RankFigures`; the reporter gathers them over its *scope* communicator — the
whole world for methods that train one model together, the rank alone for methods whose ranks
train separate models (codistillation, AFSD) — and the scope's first rank writes the record to
its `metrics` stream. The trainer never asks which kind of method it runs: it only picks the scope.

Byte figures: `bytes_sent_per_worker` / `bytes_recv_per_worker` are the mean over the scope's
ranks of the training traffic (bookkeeping tags excluded), `bytes_inter_per_worker` the part of the
sent bytes that crossed a site boundary (lowband.net.sites; all of them without a site map);
`bytes` gives every tag's mean per worker ("sent", "recv", "calls", "wire", "inter") and
`bytes_total` its sum over the scope's ranks. All are cumulative since the run began.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from lowband.comm import BOOKKEEPING_TAGS, Communicator
from lowband.data.metric import ACCURACY, Metric, bits_per_byte
from lowband.records import EpochRecord, Scores
from lowband.run.loggers import build as build_loggers
from lowband.run.metrics import MetricsSink
from lowband.run.rundir import RunDir


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, inconsistent checkpoints); exit code 1."""


@dataclass
class RankFigures:
    """One rank's figures for one epoch (plain types: they travel as JSON)."""

    loss: float
    samples: int  # trained on this epoch
    seen: int = 0  # trained on since the run began (a world change hands these on: lowband.run.reshard)
    test_acc: float | None = None  # this rank's own model; None when the epoch was not evaluated
    val_acc: float | None = None
    test_loss: float | None = None  # mean cross-entropy in nats (a language model: per byte)
    val_loss: float | None = None
    bytes: dict[str, dict[str, float]] = field(default_factory=dict)  # tag -> {"sent", "recv", "calls", "wire", "inter"}

    @property
    def sent(self) -> float:
        return sum(b["sent"] for tag, b in self.bytes.items() if tag not in BOOKKEEPING_TAGS)

    @property
    def recv(self) -> float:
        return sum(b["recv"] for tag, b in self.bytes.items() if tag not in BOOKKEEPING_TAGS)

    @property
    def inter(self) -> float:
        return sum(b.get("inter", 0.0) for tag, b in self.bytes.items() if tag not in BOOKKEEPING_TAGS)


def tag_bytes(comm: Communicator) -> dict[str, dict[str, float]]:
    """The communicator's cumulative bytes, calls, busiest-link and inter-site bytes per tag, for tags that
    moved any bytes."""
    return {tag: {"sent": s.sent, "recv": s.recv, "calls": s.calls, "wire": s.wire, "inter": s.inter}
            for tag, s in sorted(comm.ledger.stats.items()) if s.sent or s.recv}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _per_tag(ranks: list[RankFigures], reduce) -> dict[str, dict[str, float]]:
    tags = sorted({tag for r in ranks for tag in r.bytes})
    keys = ("sent", "recv", "calls", "wire", "inter")
    return {tag: {k: reduce([r.bytes.get(tag, {}).get(k, 0.0) for r in ranks]) for k in keys} for tag in tags}


def set_scores(record: EpochRecord, scores: Scores, metric: Metric) -> None:
    """The record's test and validation figures from the global model's `scores` (a language model's
    bits per byte from its losses): the one way every record (trainer, elastic job) gets them."""
    record.test_acc, record.val_acc = scores.test_acc, scores.val_acc
    record.test_loss, record.val_loss = scores.test_loss, scores.val_loss
    if metric.from_loss:
        record.val_bpb, record.test_bpb = bits_per_byte(record.val_loss), bits_per_byte(record.test_loss)


def target_of(train, metric: Metric) -> float:
    """The run's target in the workload's metric: train.target_bpb for a language model, else
    train.target_accuracy (0: none)."""
    return train.target_bpb if metric.from_loss else train.target_accuracy


def first_reached(records: Sequence[EpochRecord], metric: Metric, target: float) -> int | None:
    """The first epoch of `records` whose validation figure reaches `target` in the workload's direction (0:
    no target, None)."""
    if not target:
        return None
    return next((r.epoch for r in records if metric.reaches(r.value(metric.val_key), target)), None)


def own_evaluators(losses: list[float], n: int) -> set[int]:
    """The ranks that evaluate their own model when `n` (train.eval_ranks) is fewer than the ranks: rank 0 (its
    model stands for the run's when the method has no global one), the lowest training loss (the record's _L
    figures) and `n` ranks evenly spaced from the first to the last."""
    world = len(losses)
    if n == 0 or world <= n:
        return set(range(world))
    spaced = {round(i * (world - 1) / max(n - 1, 1)) for i in range(n)}
    return {0, min(range(world), key=lambda i: losses[i])} | spaced


def set_corpus(record: EpochRecord, meta: dict) -> None:
    """Which text a language model trained on (its sha256 and length, from the data's `meta`), so two
    machines can tell; nothing for other data."""
    record.corpus_sha256, record.corpus_bytes = meta.get("corpus_sha256"), meta.get("corpus_bytes")


class EpochReporter:
    """Gathers `RankFigures` over `scope` and writes the scope's records to `run`'s metrics stream."""

    def __init__(self, scope: Communicator, run: RunDir, log: logging.Logger, total_epochs: int,
                 loggers: Sequence[str] = (), config: dict | None = None, metric: Metric = ACCURACY):
        """`loggers`: train.loggers; the scope's leader builds them (lowband.run.loggers) and feeds them every
        record it writes; `config`: the resolved config as a dict, which they record as hyper-parameters;
        `metric`: the workload's (lowband.data.metric), whose val_/test_ figures each record carries."""
        self.scope, self.log, self.metric = scope, log, metric
        self.leader = scope.rank == 0
        built = build_loggers(list(loggers), run.path, run.rank, config or {}) if self.leader and loggers else []
        self.sink = MetricsSink(run.stream("metrics"), self.leader, total_epochs, log, built)

    def gather(self, mine: RankFigures) -> list[RankFigures]:
        """Every scope rank's figures, in scope rank order; stops training on a diverged loss."""
        parts = self.scope.all_gather_bytes(json.dumps(asdict(mine)).encode(), tag="metrics")
        ranks = [RankFigures(**json.loads(p)) for p in parts]
        return ranks

    @staticmethod
    def best_local(ranks: list[RankFigures]) -> int:
        """The scope rank whose model had the smallest training loss this epoch (the EC-DNN paper's _L)."""
        return min(range(len(ranks)), key=lambda i: ranks[i].loss)

    def record(self, epoch: int, ranks: list[RankFigures], glob: Scores | None) -> EpochRecord:
        """One metrics record. `glob`: the global model's scores (None: the method has none, so rank 0's
        own model stands for it); the trainer adds its own figures (steps, rates, seconds, the corpus)
        before writing it."""
        evaluated = ranks[0].test_acc is not None
        best = self.best_local(ranks)
        head = glob or Scores(ranks[0].test_acc, ranks[0].val_acc, ranks[0].test_loss, ranks[0].val_loss)
        record = EpochRecord(
            epoch=epoch, samples=sum(r.seen for r in ranks),
            train_loss=_mean([r.loss for r in ranks]), train_loss_ranks=[r.loss for r in ranks],
            bytes_sent_per_worker=_mean([r.sent for r in ranks]),
            bytes_recv_per_worker=_mean([r.recv for r in ranks]),
            bytes_inter_per_worker=_mean([r.inter for r in ranks]),
            bytes=_per_tag(ranks, _mean), bytes_total=_per_tag(ranks, sum))
        if evaluated:
            set_scores(record, head, self.metric)
            record.test_acc_L, record.val_acc_L = ranks[best].test_acc, ranks[best].val_acc
            record.test_acc_ranks, record.val_acc_ranks = [r.test_acc for r in ranks], [r.val_acc for r in ranks]
        return record

    def write(self, record: EpochRecord) -> None:
        self.sink.write(record)

    def close(self) -> None:
        self.sink.close()
