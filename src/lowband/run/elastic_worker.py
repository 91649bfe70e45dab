"""One worker of an elastic job: the trainer's team (run/trainer.py's `Team`) while workers leave and join.

The worker runs the trainer's loop (`Trainer(cfg, ElasticWorker(...), run_dir).fit()`); what it adds is
what is elastic, the rounds between the slices it feeds the trainer. Per round (one outer step;
comm/membership.py says how a quorum forms and commits):

  meet      arrive at the job's newest round with what this worker holds; wait for the quorum
  exchange  a gloo group of the quorum's members on a fresh store prefix (comm/rendezvous.py):
            the pseudo-gradients' collective and the outer step (methods/elastic_outer.py), then the
            source's θ_global to the receivers (tag "join"); vote; an aborted round (a member died or
            went silent, a collective failed) is undone and met again without the lost member
  commit    merge θ_global into the local model; the source writes the round to quorums.jsonl
  train     the trainer's steps on this worker's slice of the epoch's order: tau steps (tau / fragments
            for Streaming DiLoCo), each at the rate the trainer's rank would have at that place

An epoch is one pass over one order of the training set (`EpochOrder`): every round hands each
member the next slice of it, so while membership changes each sample of an epoch is trained at most
once (a slice whose worker dies is lost to that epoch) and an epoch's length in rounds depends on how
many workers there were. The round that uses the order up ends the epoch: the trainer then asks this
worker for the epoch's record, which the round's source alone makes (θ_global's scores on the epochs
train.eval_every names, the job's figures: run/elastic_files.py), completes it and writes it through
the metrics sink (metrics.jsonl, train.loggers, the console line); on the epochs
train.checkpoint_every names the source writes the job's checkpoint; after the last epoch it writes
model.safetensors and marks the job finished. Worker ids count up from 0 in the order workers
register; a joiner's id is new.

The rest is the trainer's: the data plan of the job's `train.workers` launched workers (`worker_data`,
`rank_batches`) gives the epoch's order, `checked_step` the inner step, schedule.py's `MethodSchedule`
with the method's own rules (its lr scale for the launched width, its warm-up, its lr factor) the
rate; the method's `outer_step` says how θ_global steps, and `Fragment.reduce_and_step` takes it, over
the quorum's contributors, as `lowband train` takes it over every rank. So a job whose launched
workers all stay trains what `lowband train` of the same method trains, step for step, and writes
records with the same keys (tests/faults/test_elastic_equal.py). A round in which nobody contributes
(round 0, or a round of receivers alone) runs no collective: there is no pseudo-gradient to average.

For tests, LOWBAND_ELASTIC_FAULT plans a fault per worker (run/elastic_faults.py).

A worker's exchange that fails elastic.max_failed_rounds times in a row for the same cause (its first
line, numbers aside) ends the job: the first worker to give up says why in one line, exit code 3. A
joiner (`lowband join`) whose first exchange fails leaves at once, so a joiner that cannot reach the
job holds it up for one attempt at most.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Iterator

import redis
import torch
from torch import nn

from lowband.comm import Communicator
from lowband.comm.ledger import Ledger
from lowband.comm.membership import ABORT, COMMIT, Arrival, Membership, Quorum, decide, wait_until
from lowband.comm.rendezvous import RedisStore, check_bindable
from lowband.config import Config
from lowband.data import Batch
from lowband.errors import Unavailable
from lowband.methods.base import Method
from lowband.methods.elastic_outer import ElasticOuter
from lowband.registry import METHODS
from lowband.run.elastic_faults import Faults
from lowband.run.elastic_files import JobFiles, read_job
from lowband.run.elastic_order import EpochOrder, round_steps
from lowband.run.metrics import MetricsSink, setup_logging
from lowband.run.rundir import RunDir
from lowband.run.trainer import Trainer, WorkerData
from lowband.run.workers import leave_now


def main(run_dir: str, resume: str = "0", joiner: str = "0") -> None:
    """Entry point of an elastic worker process (`lowband.run.workers` calls it); `joiner` "1": started by
    `lowband join`. The worker is the trainer's team (run/trainer.py): the trainer's loop runs it."""
    from lowband.run.runconfig import read_run_config

    cfg = read_run_config(run_dir)
    torch.set_num_threads(cfg.train.threads)
    team = ElasticWorker(cfg, run_dir, read_job(run_dir), joiner == "1")
    try:
        Trainer(cfg, team, run_dir).fit(resume == "1")  # a Diverged is recorded there; the launcher says it
    finally:
        team.close()


class ElasticWorker(JobFiles):
    """One elastic worker: the trainer's `Team` in an elastic job (its place in the job, the outer state
    of every fragment, the round it is in); what it writes and resumes from when it is a round's source
    is JobFiles' (run/elastic_files.py)."""

    syncs_in_feed = True  # the rounds run between slices, inside `feed`

    def __init__(self, cfg: Config, run_dir: str, job: dict, joiner: bool = False):
        self.cfg, self.e = cfg, cfg.elastic
        self.joiner = joiner  # started by `lowband join`: False once a round of its own has committed
        self.width, self.device = cfg.train.workers, torch.device("cpu")  # the data plan of the launched workers
        self.comm = Communicator(0, cfg.train.workers)  # names the width; no collective ever runs on it
        self.rank = 0  # this worker's id once registered (`setup`); until then rank 0's, so every worker
        #               seeds its model as rank 0 does and all start from one θ: agreeing needs no transfer
        self.log = logging.getLogger("lowband")  # set up once the id is known
        self.path = run_dir
        self.members = Membership(job["coordinator"], job["job"], self.e.dead_after_s)
        self.host = os.environ.get("LOWBAND_ELASTIC_HOST") or self.e.host  # `lowband join --host` on another machine
        check_bindable(self.host, "elastic.host")  # before registering: a worker that cannot listen never holds a round
        self.registered = False
        self.sink: MetricsSink | None = None  # opened when this worker first writes an epoch's record

    def shard(self, plan: WorkerData) -> None:
        return None  # its data come round by round, as slices of the epoch's order

    def setup(self, trainer: Trainer, model: nn.Module) -> tuple[nn.Module, Method]:
        """Register with the job (once ready to train: a quorum waits for every live worker) and build the
        outer state. The method is asked for its rules only (its lr scale for the launched width, warm-up
        and factor; its outer step): its hooks never run, the rounds are its outer loop."""
        cfg, self.trainer, self.model = self.cfg, trainer, model
        self.id = self._coordinator(lambda: self.members.register({"host": socket.gethostname(), "pid": os.getpid()}))
        self.registered, self.rank = True, self.id
        self.members.start_heartbeat(self.e.heartbeat_s)
        self.first_round, self.launched = self._coordinator(self.members.launched)
        self.run_dir = RunDir(self.path)  # the job's files: whichever worker is the round's source writes them
        self.log = setup_logging(self.path, self.id, elastic=True)
        self.outer = ElasticOuter.of(model, METHODS.get(cfg.method.name), cfg.method, cfg.train.seed * 1000 + self.id)
        self.ledger = Ledger()  # this worker's bytes, counted by every quorum's group in turn
        self.steps_per_round = round_steps(cfg.method)
        self.order = EpochOrder(cfg, trainer.plan, self.steps_per_round * cfg.train.batch_size)
        self.samples = self.order.samples
        self.marks = (0, 0.0)  # the trainer's steps and loss total when the last round committed
        self.version, self.next_round = 0, 0  # version: rounds committed into θ_global; the round met next
        self.q: Quorum | None = None  # the round last committed: its slice is trained next
        self.final: nn.Module | None = None  # Streaming DiLoCo's final model, made in the last round
        self.from_checkpoint = False  # a joiner holding a checkpoint's θ_global, until its first round commits
        self.epoch, self.cursor, self.epoch_loss, self.epoch_steps = 0, 0, 0.0, 0
        self.attempts: dict[int, int] = {}
        self.failed: tuple[str, int] = ("", 0)  # this worker's last exchange failure's cause, and how often in a row
        self.started, self.sync_s = time.monotonic(), 0.0  # sync_s: seconds in rounds (meet, exchange, commit)
        self.faults = Faults(self.id, self.members, self.path, self.log)
        return model, Method(cfg.method, trainer.method.ctx)  # an inner step's hooks: none

    # ---- what the trainer asks -------------------------------------------------------------------
    def start(self, trainer: Trainer, resume: bool) -> None:
        """From the job's checkpoint, if any (a joiner too: should every holder of θ_global be gone, the
        checkpoint stands in); then this worker's first round."""
        self._resume(said=resume)
        self.log.info(f"worker {self.id} joined (pid {os.getpid()})")
        self._next_round()

    def epochs(self, trainer: Trainer) -> Iterator[int]:
        """The epochs whose slices this worker is handed, as the rounds go, until the job has finished."""
        while self.q is not None and not self.q.finished:
            yield self.q.epoch + 1

    def feed(self, trainer: Trainer, epoch: int) -> Iterator[tuple[Batch, float]]:
        """This worker's slices of epoch `epoch`'s order, a round between two: the batches of the slice the
        last round handed it, each at the place the trainer's rank would have in the epoch, then the next
        round; until a round ends the epoch (or the job, or hands this worker a later epoch's slice)."""
        while self.q is not None and not self.q.finished and self.q.epoch + 1 == epoch:
            yield from self._slice(self.q)
            self._next_round()

    def comm_seconds(self) -> float:
        return self.sync_s

    def should_stop(self, trainer: Trainer) -> bool:
        return False  # train.stop_at_target is refused with --elastic (elastic_job.check)

    def _slice(self, q: Quorum) -> Iterator[tuple[Batch, float]]:
        start, end = q.slices[str(self.id)]
        ids, bs = self.order.ids(q.epoch)[start:end], self.cfg.train.batch_size
        for i, first in enumerate(range(0, len(ids), bs)):
            yield self.order.batch(ids[first:first + bs]), q.epoch + self.order.done(start + first)
            if i == 0:  # after the slice's first step
                self.faults.maybe(q.round + 1, "inner")
        self.faults.maybe(q.round + 1, "inner")  # a worker whose slice was empty meets its fault here

    def _next_round(self) -> None:
        """Meet, exchange and commit the next round (again until one commits); `q` None once the job has
        finished without this worker."""
        t0 = time.perf_counter()
        while True:
            q = self._meet()
            if q is None:
                self.log.info(f"worker {self.id}: the job has finished")
                break
            if self._exchange(q) == COMMIT:
                self._commit(q)
                break
        self.q = q
        self.sync_s += time.perf_counter() - t0

    def finish(self, trainer: Trainer) -> None:
        """After the last round: its source writes the final model and finishes the job; the others wait
        for that (and do it should the source die first)."""
        q = self.q
        if q is None:
            return
        if self.id == q.members[0]:
            self._finish_job()
        else:
            self._see_finished(q)
        self.log.info(f"worker {self.id}: finished with θ_global {self.outer.fingerprint()} (version {self.version})")
        self.faults.wait_for_joiner()

    def close(self, trainer: Trainer | None = None) -> None:
        try:
            self.close_files()
        finally:
            if self.registered:
                self.members.leave()

    # ---- meet ------------------------------------------------------------------------------------
    def _arrival(self) -> Arrival:
        # a joiner that read θ_global from a checkpoint never counts as holding the job's: it receives it,
        # unless nobody who holds it is left (then it is the source and the job goes on from the checkpoint)
        fingerprint = self.outer.fingerprint() + ("~checkpoint" if self.from_checkpoint else "")
        trained, loss_sum = self.trainer.step - self.marks[0], self.trainer.loss_total - self.marks[1]
        return Arrival(self.version, fingerprint, trained, loss_sum, self.epoch,
                       self.cursor, self.epoch_loss, self.epoch_steps)

    def _meet(self) -> Quorum | None:
        """Arrive at the newest round and wait for its quorum to include this worker; None once the
        job has finished. A quorum decided without this worker (it came late, or the quorum was full)
        sends it to the next round once that one commits, or to the next attempt once it aborts.
        Patience (elastic.timeout_s) counts from this worker's arrival at each round and attempt."""
        at, since, said = None, time.monotonic(), 0.0
        while True:
            try:
                if self.members.status() == "finished":
                    return None
                r = max(self.next_round, self.members.current_round())
                a = max(self.attempts.get(r, 0), self.members.current_attempt(r))
                if (r, a) != at:
                    at, since = (r, a), time.monotonic()
                self.members.reach(r)
                self.members.arrive(r, a, self._arrival())
                q = self.members.quorum(r, a) or self._decide(r, a, since)
                if q is not None and self._settled(q):
                    continue
            except redis.RedisError:
                q = None  # the coordinator is away (restarting): keep trying
            if q is not None and self.id in q.members:
                return q
            if time.monotonic() - since > self.e.wait_s:
                raise Unavailable(f"worker {self.id} waited {self.e.wait_s:g} s (elastic.wait_s) at round {at} "
                                  f"without a quorum ({self._waiting_for()}); giving up")
            if time.monotonic() - since > 5 and time.monotonic() - said > 10:  # after 5 s, then every 10 s
                self.log.info(f"worker {self.id}: waiting for a quorum ({self._waiting_for()})")
                said = time.monotonic()
            time.sleep(0.02)

    def _settled(self, q: Quorum) -> bool:
        """True when `q`'s outcome is already decided (this worker was left out, or it stalled while the
        others went on): the next round or attempt is where to go, not this exchange."""
        outcome = self.members.decided(q)
        if outcome == COMMIT:
            self.next_round = max(self.next_round, q.round + 1)
        elif outcome == ABORT:
            self.attempts[q.round] = max(self.attempts.get(q.round, 0), q.attempt + 1)
        return outcome is not None

    def _waiting_for(self) -> str:
        try:
            live = len(self.members.live())
        except redis.RedisError:
            return "the coordinator does not answer"
        if live < self.e.min_workers:
            return f"{live} worker(s) alive, elastic.min_workers={self.e.min_workers}"
        return f"{live} worker(s) alive; the round's members are still training or the quorum is full"

    def _decide(self, r: int, a: int, since: float) -> Quorum | None:
        """Propose the quorum once every live worker has arrived, or `timeout_s` has passed with at
        least `min_workers` arrived; None while neither holds."""
        arrivals, live = self.members.arrivals(r, a), self.members.live()
        present = {w: arrival for w, arrival in arrivals.items() if w in live}
        if len(present) < self.e.min_workers or self.id not in present:
            return None
        patient = time.monotonic() - since < self.e.timeout_s
        if patient and (not live <= set(present) or (r == self.first_round and len(present) < self.launched)):
            return None  # a live worker is still training, or the workers launched together are still starting
        q = decide(r, a, present, self.samples, self.steps_per_round * self.cfg.train.batch_size,
                   self.cfg.train.epochs, self.e.max_workers)
        return self.members.propose(q)

    # ---- exchange --------------------------------------------------------------------------------
    def _group(self, q: Quorum, name: str, workers: list[int], opened: list) -> Communicator:
        """A gloo group of `workers` (ranks in that order) on this quorum's own rendezvous keys; its
        store goes into `opened`, closed when the exchange ends."""
        prefix = self.members.key("pg", q.round, q.attempt, q.nonce, name)
        store = RedisStore(self.members.url, prefix, self.e.timeout_s, alive=lambda: set(workers) <= self.members.live())
        opened.append(store)
        return Communicator.over_store(store, workers.index(self.id), len(workers), torch.device("cpu"),
                                       self.e.timeout_s, self.ledger, host=self.host)

    def _coordinator(self, call):
        """call() once the coordinator answers (it may be restarting); Unavailable after elastic.wait_s."""
        answer = wait_until(lambda: (call(),), self.e.wait_s, poll_s=0.2)
        if answer is None:
            raise Unavailable(f"worker: the elastic coordinator {self.members.url} stayed away {self.e.wait_s:g} s "
                              "(elastic.wait_s)")
        return answer[0]

    def _exchange(self, q: Quorum) -> str:
        """The round's collective, outer step and state transfer, then the vote; undone unless it commits."""
        saved, opened = self.outer.state_dict(), list[RedisStore]()
        ok, cause, self.final = True, "", None
        try:
            self.faults.maybe(q.round, "exchange")
            contribute = self.id in q.contributors
            agree = self.id not in q.receivers
            if q.contributors:  # no pseudo-gradient anywhere (round 0): no collective
                comm = self._group(q, "average", q.members, opened)
                self.outer.average(comm, q.round, len(q.contributors), contribute, step=agree)
                if q.finished and len(self.outer.fragments) > 1:
                    final = self.outer.final_model(comm, q.round, len(q.contributors), contribute, self.model)
                    self.final = final if agree else None  # a receiver's θ_global arrives after it
            if q.receivers and self.id in [q.members[0]] + q.receivers:
                self._transfer(q, opened)
        except (RuntimeError, redis.RedisError) as e:
            ok, cause = False, (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            self.log.warning(f"worker {self.id}: round {q.round} attempt {q.attempt} failed ({cause}); redoing it")
        finally:
            for store in opened:
                store.close()
        self._publish_bytes()  # before the vote: a committed round's record counts every member's bytes of it
        outcome = self._outcome(q, ok)
        self._count_failure(q, cause if not ok else None)
        if outcome != COMMIT:
            self.outer.load_state_dict(saved)
            self.attempts[q.round] = q.attempt + 1
            with contextlib.suppress(redis.RedisError):
                self.members.next_attempt(q.round, q.attempt + 1)
        return outcome

    def _count_failure(self, q: Quorum, cause: str | None) -> None:
        """Count this worker's failed exchanges in a row by cause (None: this one went through); give up at
        elastic.max_failed_rounds of the same cause, or a joiner at its first (see the module doc)."""
        if cause is None:
            self.failed = ("", 0)
            return
        same = re.sub(r"\d+", "N", cause)
        count = self.failed[1] + 1 if self.failed[0] == same else 1
        self.failed = (same, count)
        if self.joiner:
            raise Unavailable(f"worker {self.id} (a joiner) could not exchange with the job's workers in round "
                              f"{q.round} ({cause}); it leaves the job. Check that they reach it at --host / "
                              f"elastic.host={self.host}")
        if count >= self.e.max_failed_rounds:
            message = (f"round {q.round} failed {count} times in a row for the same cause ({cause}); "
                       f"elastic.max_failed_rounds={self.e.max_failed_rounds}: the job stops")
            if not self._first_to_give_up():
                self.close()
                leave_now(Unavailable.exit_code)  # another worker says it, once
            raise Unavailable(message)

    def _first_to_give_up(self) -> bool:
        """Whether no other worker of the job has given up before this one (then this one says why)."""
        try:
            return bool(self.members.r.set(self.members.key("gave_up"), self.id, nx=True, ex=86_400))
        except redis.RedisError:
            return True

    def _outcome(self, q: Quorum, ok: bool) -> str:
        """Vote, then wait for the round's outcome as the coordinator holds it (never decided here
        alone: the others may have read another). A member that dies or votes fail aborts it; the
        wait is bounded by elastic.wait_s, after which this worker aborts it in the coordinator."""
        wait_until(lambda: self.members.vote(q, ok), self.e.wait_s, poll_s=0.2)
        outcome = wait_until(lambda: self.members.outcome(q), self.e.wait_s)
        if outcome is None:
            outcome = wait_until(lambda: self.members.abort(q), self.e.wait_s, poll_s=0.2)
        if outcome is None:
            raise Unavailable(f"worker {self.id}: the coordinator {self.members.url} stayed away "
                              f"{self.e.wait_s:g} s (elastic.wait_s)")
        return outcome

    def _transfer(self, q: Quorum, opened: list) -> None:
        """The source's θ_global and outer momentum to the receivers, over a group of their own."""
        comm = self._group(q, "join", [q.members[0]] + q.receivers, opened)
        vector = self.outer.state_vector() if self.id == q.members[0] else torch.zeros(self.outer.state_numel())
        comm.broadcast(vector, src=0, tag="join")
        if self.id != q.members[0]:
            self.outer.load_state_vector(vector)
        comm.close()

    # ---- commit ----------------------------------------------------------------------------------
    def _commit(self, q: Quorum) -> None:
        receiver = self.id in q.receivers
        self.outer.merge(self.outer.parts if receiver else self.outer.due(q.round), mix=1.0 if receiver else None)
        if receiver:
            self.log.info(f"worker {self.id}: received θ_global of round {q.round} (version {q.version})")
        self.version, self.next_round, self.from_checkpoint = q.version + 1, q.round + 1, False
        self.joiner = False
        with contextlib.suppress(redis.RedisError):
            self.members.reach(self.next_round)
        self.marks = (self.trainer.step, self.trainer.loss_total)
        self.epoch, self.cursor = q.epoch, q.next_cursor
        self.epoch_loss, self.epoch_steps = q.epoch_loss, q.epoch_steps
        if self.id == q.members[0]:
            self.write_round(q)

    def _publish_bytes(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.members.publish_ledger(self.ledger.traffic_by_tag())
