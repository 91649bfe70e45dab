"""What an elastic job's worker writes when it is a round's source, and how a worker resumes from it.

The source of a committed round (run/elastic_worker.py) writes the round to quorums.jsonl. When the
round ended an epoch, the trainer asks for the epoch's record: the source makes it (run/elastic_records.py:
`lowband train`'s record of θ_global, evaluated on the epochs train.eval_every names) and the trainer
completes it and writes it through this worker's metrics sink, so train.loggers mirror it; on the
epochs train.checkpoint_every names the source writes the job's checkpoint (the trainer's `due` rule).
After the last round the source writes model.safetensors, then the job's status "finished" (a member
that sees the source leave first finishes it instead). A worker that starts (a resume, or a joiner
when every holder of θ_global has gone) reads the newest intact checkpoint.

`JobFiles` is the part of `ElasticWorker` that does this; the attributes it reads are the worker's
and are named below.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from lowband.comm.membership import Membership, Quorum, wait_until
from lowband.config import Config, to_dict
from lowband.errors import UsageError
from lowband.methods.elastic_outer import ElasticOuter
from lowband.records import EpochRecord
from lowband.run import checkpoint
from lowband.run.elastic_records import checkpoint_state, epoch_record
from lowband.run.loggers import build as build_loggers
from lowband.run.metrics import MetricsSink, read_metrics
from lowband.run.reporter import first_reached, target_of
from lowband.run.rundir import RunDir
from lowband.run.trainer import Steps, Trainer

JOB_FILE = "elastic.json"


def read_job(run_dir: str) -> dict:
    """RUN_DIR/elastic.json: the coordinator's URL and the job's id, written by the launcher."""
    path = os.path.join(run_dir, JOB_FILE)
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir} is not an elastic job (no {JOB_FILE}); start one with "
                         "`lowband train --elastic`")
    try:
        with open(path, encoding="utf-8") as f:
            job = json.load(f)
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(f"{path} is damaged ({type(e).__name__}); continue the job with "
                         f"`lowband train --resume {run_dir}`, which writes it again") from None
    if not isinstance(job, dict) or not isinstance(job.get("coordinator"), str) or not isinstance(job.get("job"), str):
        raise UsageError(f"{path} is damaged (no coordinator URL and job id); continue the job with "
                         f"`lowband train --resume {run_dir}`, which writes it again")
    return job


class JobFiles:
    """The records, checkpoints and final model of an elastic job, as its worker writes and reads them."""

    # the worker's (run/elastic_worker.py), read here
    cfg: Config
    id: int
    run_dir: RunDir
    model: nn.Module
    outer: ElasticOuter
    members: Membership
    log: logging.Logger
    final: nn.Module | None
    sink: MetricsSink | None
    samples: int
    started: float
    trainer: Trainer
    q: Quorum | None
    version: int
    epoch: int
    cursor: int
    next_round: int
    from_checkpoint: bool
    _coordinator: Callable[[Callable[[], Any]], Any]

    def close_files(self) -> None:
        """Close the experiment loggers this worker opened (it wrote an epoch's record)."""
        if self.sink is not None:
            self.sink.close()

    def write_round(self, q: Quorum) -> None:
        """The source's line of a committed round in quorums.jsonl."""
        self.run_dir.stream("quorums").write({
            "round": q.round, "attempt": q.attempt, "members": q.members, "contributors": q.contributors,
            "receivers": q.receivers, "version": q.version + 1, "epoch": q.epoch + 1, "slices": q.slices,
            "elapsed_s": round(time.monotonic() - self.started, 3)})

    def _ends(self, epoch: int) -> Quorum | None:
        """The round just committed, when it ended epoch `epoch` and this worker is its source (the one
        that writes the epoch's record and checkpoint); else None."""
        q = self.q
        return q if q is not None and q.epoch_end == epoch and q.members[0] == self.id else None

    def global_model(self) -> nn.Module:
        """θ_global; after the last round of Streaming DiLoCo, with the other fragments' last outer steps
        (ElasticOuter.final_model)."""
        return self.final if self.final is not None else self.outer.global_model(self.model)

    def _finish_job(self) -> None:
        """The job's final model, then its status: finished."""
        glob = self.global_model()
        checkpoint.save_model(glob.state_dict(), self.run_dir.model_path(0), self.trainer.model_metadata())
        self._coordinator(self.members.finish)
        self.log.info(f"worker {self.id}: last epoch done; model.safetensors written")

    def _see_finished(self, q: Quorum) -> None:
        """After the last round, a member that is not its source waits for the source to finish the job,
        and finishes it itself if the source died first (all members hold the same θ_global)."""
        source = q.members[0]
        gone = wait_until(lambda: (self.members.status() == "finished" or source not in self.members.live()) or None,
                          self.cfg.elastic.wait_s, poll_s=0.1)
        if gone and self.members.status() != "finished":
            self.log.warning(f"worker {self.id}: the last round's source (worker {source}) left before finishing "
                             "the job; finishing it")
            self._finish_job()

    def record(self, trainer: Trainer, epoch: int, done: Steps, evaluate: bool) -> tuple[EpochRecord, int] | None:
        """The job's record of epoch `epoch` (run/elastic_records.py), when this worker is the source of the
        round that ended it; θ_global evaluated when `evaluate`. The trainer completes and writes it; its
        target epoch counts the earlier epochs' records, whichever worker wrote them."""
        q = self._ends(epoch)
        if q is None:
            return None
        scores = trainer.scores(self.global_model()) if evaluate else None
        metric = trainer.metric
        trainer.reached_target = first_reached(read_metrics(self.run_dir.path), metric, target_of(self.cfg.train, metric))
        record = epoch_record(q, scores, metric, self._ledgers(), fragments=getattr(self.cfg.method, "fragments", 1),
                              samples=q.epoch_end * self.samples)
        return record, self.samples

    def write(self, record: EpochRecord) -> None:
        self._sink().write(record)

    def _sink(self) -> MetricsSink:
        """The job's metrics stream and experiment loggers (train.loggers), as `lowband train`'s reporter
        feeds them. Each worker that writes an epoch's record opens the loggers once, for the job as a
        whole (rank 0's folders): TensorBoard then reads one curve from every writer's event file."""
        if self.sink is None:
            built = build_loggers(list(self.cfg.train.loggers), self.run_dir.path, 0, to_dict(self.cfg))
            self.sink = MetricsSink(self.run_dir.stream("metrics"), True, self.cfg.train.epochs, self.log, built)
        return self.sink

    def _ledgers(self) -> dict:
        """Every worker's published bytes by tag (a resumed job's earlier part under EARLIER)."""
        return wait_until(self.members.ledgers, 30.0, poll_s=0.2) or {}

    def checkpoint(self, trainer: Trainer, epoch: int) -> None:
        """The job's state after epoch `epoch` (rank 0's checkpoint of it), written by the source of the round
        that ended it."""
        q = self._ends(epoch)
        if q is None:
            return
        state = checkpoint_state(q, self.outer.state_dict(), self.model, self._ledgers())
        checkpoint.save_state(state, checkpoint.rank_path(self.run_dir.path, 0, q.epoch_end))  # the job's: rank 0's
        checkpoint.prune(self.run_dir.path, 0)

    def _resume(self, said: bool) -> None:
        """Start from the job's newest intact checkpoint, if any (`said`: a resume, which warns without one)."""
        path, passed = checkpoint.newest_intact(self.run_dir.path)
        if passed:
            self.log.warning(f"worker {self.id}: passed over newer checkpoints: {'; '.join(passed)}")
        if path is None:
            if said:
                self.log.warning(f"worker {self.id}: no elastic checkpoint in {self.run_dir.path}; starting from "
                                 "scratch")
            return
        state = checkpoint.load_state(path)
        self.outer.load_state_dict(state["outer"])
        self.outer.forget_feedback()  # the residual saved was the source's own, not this worker's
        self.from_checkpoint = not said
        self.model.load_state_dict(state["model"])
        self.outer.merge(self.outer.parts, mix=1.0)
        self.version, self.epoch, self.cursor = int(state["version"]), int(state["epoch"]), 0
        self.next_round = int(state["round"])
        self.log.info(f"worker {self.id}: starts from {path} (round {state['round']})")
