"""One worker of an elastic job: the trainer's team (training/trainer.py's `Team`) while workers leave and join.

The worker runs the trainer's loop (`Trainer(cfg, ElasticWorker(...), run_dir).fit()`) and the method's
own hooks: its outer steps go through the job's quorum (comm/elastic_quorum.py), which the method consults
as it would a fixed world's. What this team adds is the data and the job's files:

  data      an epoch is one pass over one order of the training set (`EpochOrder`); every round hands each
            member the next slice of it, as many steps as the method has to its next outer step, so while
            membership changes each sample of an epoch is trained at most once (a slice whose worker dies
            is lost to that epoch) and an epoch's length in rounds depends on how many workers there were.
            A slice that ends where the method takes no outer step (the epoch ends between two) is followed
            by a meeting without an exchange, which hands out the next slices.
  records   the round that uses the order up ends the epoch: the trainer asks for the epoch's record, which
            the source of this worker's last round makes (θ_global's scores on the epochs train.eval_every
            names, the job's figures: training/elastic/files.py); the trainer completes it and writes it through
            the metrics sink. After the last epoch every member takes part in the method's final model
            (its last outer steps: one more round), whose source writes model.safetensors and finishes the job.

Worker ids count up from 0 in the order workers register; a joiner's id is new. Every worker seeds its
model as rank 0 does, so all start from one θ and agreeing needs no transfer. So a job whose launched
workers all stay trains what `lowband train` of the same method trains, step for step, and writes records
with the same keys (tests/faults/test_elastic_equal.py).

For tests, LOWBAND_ELASTIC_FAULT plans a fault per worker (training/elastic/faults.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator

import torch
from torch import nn

from lowband.comm import Communicator
from lowband.comm.elastic_quorum import ElasticQuorum, Patience, fingerprint
from lowband.comm.membership import Decision, Membership
from lowband.comm.quorum import OuterState, Quorum
from lowband.comm.rendezvous import check_bindable
from lowband.config import Config
from lowband.data import Batch
from lowband.run.metrics import MetricsSink, setup_logging
from lowband.run.rundir import RunDir
from lowband.run.workers import leave_now
from lowband.training.elastic.faults import Faults
from lowband.training.elastic.files import JobFiles, read_job
from lowband.training.elastic.order import EpochOrder
from lowband.training.elastic.plan import DataPlan, Handout
from lowband.training.trainer import Resumed, Seat, Trainer


def main(run_dir: str, resume: str = "0", joiner: str = "0") -> None:
    """Entry point of an elastic worker process (`lowband.run.workers` calls it); `joiner` "1": started by
    `lowband join`. The worker is the trainer's team (training/trainer.py): the trainer's loop runs it."""
    from lowband.training.runconfig import read_run_config

    cfg = read_run_config(run_dir)
    torch.set_num_threads(cfg.train.threads)
    team = ElasticWorker(cfg, run_dir, read_job(run_dir), joiner == "1")
    trainer = None
    try:
        trainer = Trainer(cfg, team, run_dir)
        trainer.fit(resume == "1")  # a Diverged is recorded there; the launcher says it
    finally:
        trainer.close() if trainer is not None else team.close()


def outer_state(method) -> OuterState:
    """The method as the quorum handles it: an elastic job runs only methods whose `check_elastic` passes,
    and those keep their outer state as comm/quorum.py's OuterState says."""
    if not isinstance(method, OuterState):
        raise TypeError(f"{type(method).__name__} runs elastic but has no outer state (comm/quorum.py's OuterState)")
    return method


class ElasticWorker(JobFiles):
    """One elastic worker: the trainer's `Team` in an elastic job (its quorum, the epoch's order, the job's
    files: JobFiles, training/elastic/files.py)."""

    def __init__(self, cfg: Config, run_dir: str, job: dict, joiner: bool = False):
        self.cfg, self.e = cfg, cfg.elastic
        self.is_joiner = joiner  # started by `lowband join`
        self.width, self.device = cfg.train.workers, torch.device("cpu")  # the data plan of the launched workers
        self.rank = 0  # this worker's id once registered (`setup`); until then rank 0's, so every worker
        #               seeds its model as rank 0 does and all start from one θ: agreeing needs no transfer
        self.log = logging.getLogger("lowband")  # set up once the id is known
        self.path = run_dir
        self.members = Membership(job["coordinator"], job["job"], self.e.dead_after_s)
        self.started = float(job.get("started_at") or time.time())  # the job's clock (JobFiles.clock)
        self.host = os.environ.get("LOWBAND_ELASTIC_HOST") or self.e.host  # `lowband join --host` on another machine
        check_bindable(self.host, "elastic.host")  # before registering: a worker that cannot listen never holds a round
        self.sink: MetricsSink | None = None  # opened when this worker first writes an epoch's record
        self.outer: ElasticQuorum | None = None
        self.data: DataPlan | None = None  # which samples each round hands this worker (`setup`)
        self.faults: Faults | None = None  # set once the worker's id is known
        self.final: nn.Module | None = None  # the job's final model, once this worker took part in making it
        self.writes = 0  # the epoch whose record this worker claimed (JobFiles._claim)
        self.last_round: tuple[Decision, bool] | None = None  # JobFiles.write_round
        self.seen_checkpoint: str | None = None  # JobFiles.catch_up

    # ---- what the trainer asks -------------------------------------------------------------------
    def join(self, trainer: Trainer) -> Seat:
        """Register with the job (once the data are loaded: a quorum waits for every live worker): this
        worker's seat is its id, itself alone as the method's communicator and the job's quorum."""
        e, c = self.e, self.cfg
        self.trainer = trainer
        self.samples = c.train.workers * trainer.plan.steps * c.train.batch_size
        self.data = DataPlan(self.samples, c.train.batch_size, c.train.epochs, lambda: (trainer.step, trainer.loss_total),
                             lambda: self.state.steps_to_sync())
        patience = Patience(e.min_workers, e.max_workers, e.timeout_s, e.wait_s, e.max_failed_rounds)
        self.outer = ElasticQuorum(self.members, patience, self.host, self.log, self, leave_now)
        self.id = self.outer.join({"host": socket.gethostname(), "pid": os.getpid()}, e.heartbeat_s, self.is_joiner)
        self.rank, self.comm = self.id, self.outer.alone()
        self.run_dir = RunDir(self.path)  # the job's files: whichever worker is the round's source writes them
        self.log = self.outer.log = setup_logging(self.path, self.id, elastic=True)
        self.faults = Faults(self.id, self.members, self.path, self.log)
        return Seat(self.id, self.comm, self.device, self.log, self.quorum, None, self.sync_seconds)

    # ---- what the quorum asks (comm/elastic_quorum.py's Participant) ---------------------------------
    def steps(self) -> int:
        return self.trainer.step

    def bring(self) -> dict:
        assert self.data is not None
        return self.data.bring()

    def plan(self, q: Decision, brought: dict[int, dict]) -> dict:
        assert self.data is not None
        return self.data.decide(q, brought)

    def committed(self, q: Decision, outer: bool) -> None:
        assert self.data is not None
        self.data.take(q)
        self.write_round(q, outer)

    def behind(self) -> None:
        self.catch_up()

    def fault(self, round_no: int, where: str) -> None:
        if self.faults is not None:
            self.faults.maybe(round_no, where)

    def busy(self) -> float:
        return self.trainer.method_eval_s

    def quorum(self, comm: Communicator) -> Quorum:
        """The job's quorum, whatever communicator the method names (it is this worker alone)."""
        assert self.outer is not None
        return self.outer

    def start(self, trainer: Trainer, resume: bool) -> Resumed | None:
        """From the job's checkpoint, if any (a joiner too: should every holder of θ_global be gone, the
        checkpoint stands in); then this worker's first round."""
        self.state = outer_state(trainer.method)
        self.order = EpochOrder(self.cfg, trainer.plan, self.state.next_sync)
        self._resume(self.state, said=resume)
        self.log.info(f"worker {self.id} joined (pid {os.getpid()})")
        self._meeting()
        return None  # the trainer's counters are this process's own

    def epochs(self, trainer: Trainer) -> Iterator[tuple[int, Iterator[tuple[Batch, float]]]]:
        """The epochs whose slices this worker is handed, as the rounds go, until the job has finished
        (train.stop_at_target is refused with --elastic: training/elastic/job.py's check)."""
        while (h := self._now()) is not None and not h.finished:
            yield h.epoch + 1, self._feed(trainer, h.epoch + 1)

    def _feed(self, trainer: Trainer, epoch: int) -> Iterator[tuple[Batch, float]]:
        """This worker's slices of epoch `epoch`'s order: the batches of the slice the last round handed it,
        each at the place the trainer's rank would have in the epoch; after a slice where the method took
        no outer step, a meeting hands out the next; until a round ends the epoch (or the job)."""
        while (h := self._now()) is not None and not h.finished and h.epoch + 1 == epoch:
            rounds = self._rounds()
            yield from self._slice(h, self._q())
            if self._rounds() == rounds:  # the slice ended between two outer steps
                self._meeting()

    def sync_seconds(self) -> float:
        """Seconds in the job's rounds (meetings included), the worker's own work left out."""
        return self.outer.sync_s if self.outer else 0.0

    def _q(self) -> Decision | None:
        return self.outer.q if self.outer else None

    def _now(self) -> Handout | None:
        """The data of the round this worker last committed; None once the job has finished."""
        return self.data.now if self.data is not None and self._q() is not None else None

    def _rounds(self) -> int:
        return self.outer.rounds if self.outer else 0

    def _meeting(self) -> None:
        """A round without an exchange: the next slices (and θ_global for a receiver)."""
        assert self.outer is not None
        self.outer.meeting(self.state)

    def _slice(self, h: Handout, q: Decision | None) -> Iterator[tuple[Batch, float]]:
        assert q is not None
        start, end = h.slices[str(self.id)]
        ids, bs = self.order.ids(h.epoch)[start:end], self.cfg.train.batch_size
        for i, first in enumerate(range(0, len(ids), bs)):
            yield self.order.batch(ids[first:first + bs]), h.epoch + self.order.done(h.epoch, start + first)
            if i == 0:  # after the slice's first step
                self.fault(q.round + 1, "inner")
        self.fault(q.round + 1, "inner")  # a worker whose slice was empty meets its fault here

    def finish(self, trainer: Trainer) -> None:
        """After the last round: the final model (a worker that trained no part of the last epoch takes part
        in its round now), written by the source of the last round, which finishes the job; the others wait
        for that (and do it should the source die first)."""
        if self.final is None and self._q() is not None:
            self.final = trainer.method.global_model(final=True)
        q = self._q()
        if q is None:
            return
        if q.members[0] == self.id:
            self._finish_job(self.final)
        else:
            self._see_finished(q)
        mark = fingerprint(self.state)
        self.log.info(f"worker {self.id}: finished with θ_global {mark} (version {self.outer.version if self.outer else 0})")
        if self.faults is not None:
            self.faults.wait_for_joiner()

    def close(self, trainer: Trainer | None = None) -> None:
        try:
            self.close_files()
        finally:
            if self.outer is not None:
                self.outer.leave()
