"""An elastic job's quorum: the workers that meet at an outer step, under the method (comm/quorum.py).

The method's outer step asks it `outer_step(exchange, state)`, as torchft's DiLoCo asks its Manager; the
worker asks for a `meeting(state)`, a round without an exchange, where its plan hands out work without an
outer step (an elastic job's first round; its data running out between two outer steps). The quorum decides
who is in a round and moves the state; what a round hands out is the worker's (its `Participant`: an
elastic job's data plan rides in the round as JSON the quorum never reads). Per round (comm/membership.py
says how a quorum forms and commits):

  meet      arrive at the job's newest round with what this worker holds (its version, a fingerprint of
            the method's shared state, the steps it trained, what its plan brings); wait for the quorum
            (every live worker, or `timeout_s` with `min_workers`); the decider asks its plan for the handout
  exchange  the members that hold the source's θ_global (they agree on the clock, so on what is due)
            run the method's `exchange` over a gloo group of their own on a fresh store prefix
            (comm/rendezvous.py); then the source's shared state goes to the receivers (tag "join")
  vote      every member votes; the round commits when all say done, and aborts when one fails or dies
  commit    a receiver takes the source's state (`state.receive`); every member's participant is told
            (`committed`). An aborted round is undone (`state.restore`) and met again.

A round in which nobody has a pseudo-gradient (the first, or receivers alone) runs no collective.
A worker's exchange that fails `max_failed_rounds` times in a row for the same cause (its first line,
numbers aside) gives up: the first worker to give up says why in one line (Unavailable, exit 3), the
others leave quietly. A joiner whose first exchange fails leaves at once, so a joiner that cannot reach
the job holds it up for one attempt at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

import redis
import torch

from lowband.comm.communicator import Communicator
from lowband.comm.ledger import Ledger
from lowband.comm.meet import Meet, Patience
from lowband.comm.membership import COMMIT, Arrival, Decision, Membership, wait_until
from lowband.comm.quorum import Exchange, OuterState, Round, pack_state, unpack_state
from lowband.comm.rendezvous import RedisStore
from lowband.errors import Unavailable


class Participant(Protocol):
    """The worker the quorum serves: what it brings to a round and is told of it (given at construction)."""

    def steps(self) -> int:
        """Steps this worker has trained since it started."""

    def bring(self) -> dict:
        """What its plan brings to a round (JSON)."""

    def plan(self, q: Decision, brought: dict[int, dict]) -> dict:
        """What round `q` hands its members, from what each brought (a pure function; JSON)."""

    def committed(self, q: Decision, outer: bool) -> None:
        """Round `q` committed; `outer`: it took an outer step (False: a meeting)."""

    def behind(self) -> None:
        """It arrives behind the job (rounds were committed without it): it may take a newer θ_global from
        the job's checkpoint (`resume_at(..., from_checkpoint=True)`)."""

    def fault(self, round_no: int, where: str) -> None:
        """A test's planned fault (training/elastic/faults.py)."""

    def busy(self) -> float:
        """Seconds spent on work of its own (the method's evaluations of a round), left out of `sync_s`."""


def fingerprint(state: OuterState) -> str:
    """16 hex digits of the method's shared state: members of one version compare them to know they agree."""
    return hashlib.blake2b(pack_state(state.shared_state()), digest_size=8).hexdigest()


class GiveUp:
    """Counts a worker's failed exchanges in a row by cause and says when it gives up (the module doc)."""

    def __init__(self, members: Membership, patience: Patience, quit: Callable[[int], NoReturn]):
        self.members, self.patience, self.quit = members, patience, quit
        self.failed: tuple[str, int] = ("", 0)  # the last failure's cause (numbers aside), how often in a row

    def count(self, worker: int, round_no: int, cause: str | None, joiner: bool, host: str) -> None:
        """Count one exchange (`cause` None: it went through); raise Unavailable when the worker gives up."""
        if cause is None:
            self.failed = ("", 0)
            return
        same = re.sub(r"\d+", "N", cause)
        count = self.failed[1] + 1 if self.failed[0] == same else 1
        self.failed = (same, count)
        if joiner:
            raise Unavailable(f"worker {worker} (a joiner) could not exchange with the job's workers in round "
                              f"{round_no} ({cause}); it leaves the job. Check that they reach it at --host / "
                              f"elastic.host={host}")
        if count >= self.patience.max_failed_rounds:
            message = (f"round {round_no} failed {count} times in a row for the same cause ({cause}); "
                       f"elastic.max_failed_rounds={self.patience.max_failed_rounds}: the job stops")
            if not self._first(worker):
                self.members.leave()
                self.quit(Unavailable.exit_code)  # another worker says it, once
            raise Unavailable(message)

    def _first(self, worker: int) -> bool:
        """Whether no other worker of the job has given up before this one (then this one says why)."""
        try:
            return bool(self.members.r.set(self.members.key("gave_up"), worker, nx=True, ex=86_400))
        except redis.RedisError:
            return True


class ElasticQuorum:
    """One worker's place in an elastic job's rounds (see the module docstring)."""

    def __init__(self, members: Membership, patience: Patience, host: str, log: logging.Logger,
                 worker: Participant, quit: Callable[[int], NoReturn]):
        """`worker`: what this worker brings and is told (Participant); `quit(code)` ends the process at once
        (a worker that gives up after another said why)."""
        self.members, self.patience, self.host, self.log, self.worker = members, patience, host, log, worker
        self.give_up, self.meet = GiveUp(members, patience, quit), Meet(members, patience, log)
        self.ledger = Ledger()  # this worker's bytes, counted by every round's group in turn
        self.joiner = False  # started by `lowband join`: False once a round of its own has committed
        self.version = 0  # rounds committed into θ_global
        self.q: Decision | None = None  # the round last committed (None once the job has finished)
        self.rounds = 0  # rounds this worker committed
        self.from_checkpoint = False  # holding a checkpoint's θ_global, until its first round commits
        self.received_at = 0  # steps() when it last received θ_global (or resumed)
        self.sync_s = 0.0  # seconds in rounds (meet, exchange, commit), the worker's own work left out

    @property
    def id(self) -> int:
        """This worker's id in the job (-1 until `join`); `Meet` holds it, the one owner."""
        return self.meet.id

    # ---- joining and leaving -----------------------------------------------------------------------
    def join(self, info: dict, heartbeat_s: float, joiner: bool) -> int:
        """Register with the job (a new worker id) and keep a heartbeat; the id."""
        self.meet.id = self.ask(lambda: self.members.register(info))
        self.members.start_heartbeat(heartbeat_s)
        self.meet.first_round, self.meet.launched = self.ask(self.members.launched)
        self.joiner = joiner
        return self.id

    def leave(self) -> None:
        if self.id >= 0:
            self.members.leave()

    def alone(self) -> Communicator:
        """This worker alone, counting into its ledger: the method's context's communicator."""
        comm = Communicator(0, 1, global_ranks=[self.id])
        comm.ledger = self.ledger
        return comm

    def resume_at(self, version: int, round_no: int, from_checkpoint: bool) -> None:
        """Start from a checkpoint of the job's: its version, the round after it. What this worker trained
        before (a stopped worker's stale steps) is not contributed."""
        self.version, self.meet.next_round, self.from_checkpoint = version, round_no, from_checkpoint
        self.received_at = self.worker.steps()

    def ask(self, call):
        """call() once the coordinator answers (it may be restarting); Unavailable after wait_s."""
        answer = wait_until(lambda: (call(),), self.patience.wait_s, poll_s=0.2)
        if answer is None:
            raise Unavailable(f"worker: the elastic coordinator {self.members.url} stayed away "
                              f"{self.patience.wait_s:g} s (elastic.wait_s)")
        return answer[0]

    # ---- a round -----------------------------------------------------------------------------------
    def outer_step(self, exchange: Exchange, state: OuterState) -> None:
        """The method's outer step: meet, exchange, vote and commit a round (again until one commits)."""
        self._round(exchange, state)

    def meeting(self, state: OuterState) -> None:
        """A round without an exchange: the plan's next handout (and θ_global for a receiver)."""
        self._round(None, state)

    def _round(self, exchange: Exchange | None, state: OuterState) -> None:
        """Meet, exchange, vote and commit (again until one commits); nothing once the job has finished."""
        t0, busy0 = time.perf_counter(), self.worker.busy()
        try:
            if self.meet.behind():
                self.worker.behind()
            while True:
                q = self.meet.wait(lambda: self._arrival(state), self.worker.plan, self.from_checkpoint)
                if q is None:
                    self.log.info(f"worker {self.id}: the job has finished")
                    self.q = None
                    return
                outcome, payload = self._exchange(q, exchange, state)
                if outcome == COMMIT:
                    self._commit(q, state, payload, outer=exchange is not None and bool(q.contributors))
                    return
        finally:
            self.sync_s += time.perf_counter() - t0 - (self.worker.busy() - busy0)

    def _arrival(self, state: OuterState) -> Arrival:
        # a joiner that read θ_global from a checkpoint never counts as holding the job's: it receives it,
        # unless nobody who holds it is left (then it is the source and the job goes on from the checkpoint)
        mark = fingerprint(state) + ("~checkpoint" if self.from_checkpoint else "")
        return Arrival(self.version, mark, self.worker.steps() - self.received_at, self.worker.bring())

    def _exchange(self, q: Decision, exchange: Exchange | None, state: OuterState) -> tuple[str, bytes | None]:
        """The round's collective (the members that agree) and the state's transfer (to the receivers), then
        the vote; undone unless it commits. Returns the outcome and what a receiver received."""
        takes_part = exchange is not None and bool(q.contributors) and self.id not in q.receivers
        saved = state.snapshot() if takes_part else None
        opened: list[RedisStore] = []
        ok, cause, payload = True, "", None
        try:
            self.worker.fault(q.round, "exchange")
            if takes_part:
                assert exchange is not None
                exchange(Round(self._group(q, "average", q.agree, opened), len(q.contributors),
                               self.id in q.contributors))
            if q.receivers and self.id in [q.members[0]] + q.receivers:
                payload = self._transfer(q, state, opened)
        except (RuntimeError, redis.RedisError) as e:
            ok, cause = False, (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            self.log.warning(f"worker {self.id}: round {q.round} attempt {q.attempt} failed ({cause}); redoing it")
        finally:
            for store in opened:
                store.close()
        with contextlib.suppress(redis.RedisError):  # before the vote: the round's record counts every member's bytes
            self.members.publish_ledger(self.ledger.traffic_by_tag())
        outcome = self.members.settle(q, ok, self.patience.wait_s, self.id)
        self.give_up.count(self.id, q.round, cause if not ok else None, self.joiner, self.host)
        if outcome != COMMIT:
            if saved is not None:
                state.restore(saved)
            self.meet.aborted(q)
        return outcome, payload

    def _group(self, q: Decision, name: str, workers: list[int], opened: list) -> Communicator:
        """A gloo group of `workers` (ranks in that order) on this quorum's own rendezvous keys; its
        store goes into `opened`, closed when the exchange ends."""
        prefix = self.members.key("pg", q.round, q.attempt, q.nonce, name)
        store = RedisStore(self.members.url, prefix, self.patience.timeout_s,
                           alive=lambda: set(workers) <= self.members.live())
        opened.append(store)
        return Communicator.over_store(store, workers.index(self.id), len(workers), torch.device("cpu"),
                                       self.patience.timeout_s, self.ledger, host=self.host)

    def _transfer(self, q: Decision, state: OuterState, opened: list) -> bytes | None:
        """The source's shared state and handover to the receivers, over a group of their own, as bytes."""
        comm = self._group(q, "join", [q.members[0]] + q.receivers, opened)
        source = self.id == q.members[0]
        data = pack_state({"shared": state.shared_state(), "extra": state.handover()}) if source else None
        received = comm.broadcast_bytes(data, src=0, tag="join")
        comm.close()
        return None if source else received

    def _commit(self, q: Decision, state: OuterState, payload: bytes | None, outer: bool) -> None:
        if payload is not None:  # a receiver: the source's state, and θ_global in the local model
            got = unpack_state(payload)
            state.receive(got["shared"], got["extra"])
            self.received_at = self.worker.steps()
            self.log.info(f"worker {self.id}: received θ_global of round {q.round} (version {q.version})")
        self.version, self.from_checkpoint, self.joiner = q.version + 1, False, False
        self.meet.committed(q)
        self.q, self.rounds = q, self.rounds + 1
        self.worker.committed(q, outer)
