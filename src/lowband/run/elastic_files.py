"""What an elastic job's worker writes when it is a round's source, and how a worker resumes from it.

The source of a committed round (run/elastic_worker.py) writes the round to quorums.jsonl; when the
round ended an epoch, the epoch's record (run/elastic_records.py: `lowband train`'s record of θ_global,
through the trainer's metrics sink, so train.loggers mirror it) on the epochs train.eval_every names
evaluated, and a checkpoint on those train.checkpoint_every names (`trainer.due`, the trainer's rule);
after the last round, model.safetensors, then the job's status "finished" (a member that sees the
source leave first finishes it instead). A worker that starts (a resume, or a joiner when every
holder of θ_global has gone) reads the newest intact checkpoint.

`JobFiles` is the part of `ElasticWorker` that does this; the attributes it reads are the worker's
and are named below.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lowband.comm.membership import Membership, Quorum, wait_until
from lowband.config import Config, to_dict
from lowband.data import TensorData
from lowband.data.metric import metric_for
from lowband.methods.elastic_outer import ElasticOuter
from lowband.run import checkpoint
from lowband.run.elastic_records import checkpoint_state, epoch_record, reached_target
from lowband.run.loggers import build as build_loggers
from lowband.run.metrics import MetricsSink, human_bytes, read_metrics
from lowband.run.reporter import set_corpus, target_of
from lowband.run.rundir import RunDir
from lowband.run.trainer import due, model_metadata, model_scores


class JobFiles:
    """The records, checkpoints and final model of an elastic job, as its worker writes and reads them."""

    # the worker's (run/elastic_worker.py), read here
    cfg: Config
    id: int
    run_dir: RunDir
    data: TensorData
    model: nn.Module
    optimizer: torch.optim.Optimizer
    outer: ElasticOuter
    members: Membership
    log: logging.Logger
    final: nn.Module | None
    sink: MetricsSink | None
    samples: int
    steps: int
    started: float
    epoch_s: float
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

    def _record(self, q: Quorum) -> None:
        """The source's records: the round, and when an epoch ended its evaluation and checkpoint."""
        elapsed = time.monotonic() - self.started
        self.run_dir.stream("quorums").write({
            "round": q.round, "attempt": q.attempt, "members": q.members, "contributors": q.contributors,
            "receivers": q.receivers, "version": q.version + 1, "epoch": q.epoch + 1, "slices": q.slices,
            "elapsed_s": round(elapsed, 3)})
        if q.epoch_end >= 0:
            self._epoch_record(q, elapsed)
            if due(q.epoch_end, self.cfg.train.checkpoint_every, self.cfg.train.epochs):
                self._checkpoint(q)
        if q.finished:
            self._finish_job()

    def global_model(self) -> nn.Module:
        """θ_global; after the last round of Streaming DiLoCo, with the other fragments' last outer steps
        (ElasticOuter.final_model)."""
        return self.final if self.final is not None else self.outer.global_model(self.model)

    def _finish_job(self) -> None:
        """The job's final model, then its status: finished."""
        glob = self.global_model()
        checkpoint.save_model(glob.state_dict(), self.run_dir.model_path(0), model_metadata(self.cfg, self.data))
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

    def _epoch_record(self, q: Quorum, elapsed: float) -> None:
        """metrics.jsonl's record of epoch q.epoch_end (run/elastic_records.py) and its console line."""
        t0 = time.monotonic()
        scores = (model_scores(self.global_model(), self.data, self.cfg.train.eval_batch_size, torch.device("cpu"))
                  if due(q.epoch_end, self.cfg.train.eval_every, self.cfg.train.epochs) else None)
        metric = metric_for(self.cfg.data.name)
        record = epoch_record(q, scores, metric, self._ledgers(), fragments=getattr(self.cfg.method, "fragments", 1),
                              samples=q.epoch_end * self.samples, steps=self.steps,
                              lr=self.optimizer.param_groups[0]["lr"], epoch_s=self.epoch_s + time.monotonic() - t0,
                              eval_s=time.monotonic() - t0, elapsed_s=elapsed)
        set_corpus(record, self.data.meta)
        record.reached_target_epoch = reached_target(read_metrics(self.run_dir.path), record, metric,
                                                     target_of(self.cfg.train, metric))
        self._sink().publish(record)
        figure = (f"val bpb {record.val_bpb:.4f}" if record.val_bpb is not None
                  else f"val acc {record.val_acc:.4f}" if record.val_acc is not None
                  else f"test acc {record.test_acc:.4f}" if record.test_acc is not None else "not evaluated")
        self.log.info(f"epoch {q.epoch_end}/{self.cfg.train.epochs}  round {q.round}  {len(q.members)} worker(s)  "
                      f"loss {q.ended_loss:.4f}  {figure}  sent "
                      f"{human_bytes(record.bytes_sent_per_worker * max(record.extra['workers_seen'], 1))} in all  "
                      f"{elapsed:.1f}s")

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

    def _checkpoint(self, q: Quorum) -> None:
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
