"""An elastic job's quorum: the workers that meet at an outer step, under the method (comm/quorum.py).

The method's outer step asks it `outer_step(exchange, state)`, as torchft's DiLoCo asks its Manager; a
team asks it for a meeting without an exchange (`exchange` None) where the data hands out the next slices
without an outer step (the job's first round, an epoch that ends between two outer steps). Per round
(comm/membership.py says how a quorum forms and commits):

  meet      arrive at the job's newest round with what this worker holds (its version, a fingerprint of
            the method's shared state, the steps it trained, its data progress, the steps to its next
            outer step); wait for the quorum (every live worker, or `timeout_s` with `min_workers`)
  exchange  the members that hold the source's θ_global (they agree on the clock, so on what is due)
            run the method's `exchange` over a gloo group of their own on a fresh store prefix
            (comm/rendezvous.py); then the source's shared state goes to the receivers (tag "join")
  vote      every member votes; the round commits when all say done, and aborts when one fails or dies
  commit    a receiver takes the source's state (`state.receive`); every member takes the round's data
            progress and its slice. An aborted round is undone (`state.restore`) and met again.

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
from dataclasses import dataclass
from typing import NoReturn

import redis
import torch

from lowband.comm.communicator import Communicator
from lowband.comm.ledger import Ledger
from lowband.comm.membership import ABORT, COMMIT, Arrival, Decision, Membership, decide, wait_until
from lowband.comm.quorum import Exchange, OuterState, Round, pack_state, unpack_state
from lowband.comm.rendezvous import RedisStore
from lowband.errors import Unavailable


@dataclass(frozen=True)
class Patience:
    """How long a worker waits, and how few it trains with (elastic.* in the config)."""

    min_workers: int = 1
    max_workers: int = 0
    timeout_s: float = 30.0  # for a quorum to form with fewer than every live worker; a collective's timeout
    wait_s: float = 600.0  # for the coordinator, a vote, a quorum with min_workers
    max_failed_rounds: int = 5


@dataclass(frozen=True)
class Epochs:
    """The data plan the quorums hand out: samples in an epoch's order, batch, epochs."""

    samples: int
    batch: int
    epochs: int


def fingerprint(state: OuterState) -> str:
    """16 hex digits of the method's shared state: members of one version compare them to know they agree."""
    return hashlib.blake2b(pack_state(state.shared_state()), digest_size=8).hexdigest()


class ElasticQuorum:
    """One worker's place in an elastic job's rounds (see the module docstring)."""

    def __init__(self, members: Membership, patience: Patience, plan: Epochs, host: str, log: logging.Logger,
                 progress: Callable[[], tuple[int, float]], quit: Callable[[int], NoReturn],
                 fault: Callable[[int, str], None] = lambda r, w: None, busy: Callable[[], float] = lambda: 0.0):
        """`progress()`: the steps this worker has trained and their summed loss since it started; `quit(code)`
        ends the process at once (a worker that gives up after another said why); `fault(round, where)`: a
        test's planned fault (training/elastic/faults.py); `busy()`: seconds the caller has spent on work of
        its own (the method's evaluations of a round), left out of `sync_s` when spent inside a round."""
        self.members, self.patience, self.plan, self.host, self.log = members, patience, plan, host, log
        self.progress, self.quit, self.fault, self.busy = progress, quit, fault, busy
        #: told of every round this worker commits, and whether it was an outer step (False: a meeting)
        self.committed: Callable[[Decision, bool], None] = lambda q, outer: None
        #: called when this worker arrives behind the job (rounds were committed without it): the worker
        #: may take a newer θ_global from the job's checkpoint (resume_at, from_checkpoint=True)
        self.behind: Callable[[], None] = lambda: None
        self.ledger = Ledger()  # this worker's bytes, counted by every round's group in turn
        self.id = -1  # set by `join`
        self.joiner = False  # started by `lowband join`: False once a round of its own has committed
        self.version, self.next_round = 0, 0  # version: rounds committed into θ_global; the round met next
        self.q: Decision | None = None  # the round last committed: its slice is trained next
        self.ended: Decision | None = None  # the last committed round that ended an epoch
        self.rounds = 0  # rounds this worker committed
        self.from_checkpoint = False  # holding a checkpoint's θ_global, until its first round commits
        self.epoch, self.cursor, self.epoch_loss, self.epoch_steps = 0, 0, 0.0, 0
        self.received_at, self.round_at = (0, 0.0), (0, 0.0)  # progress() when it last received; last committed
        self.attempts: dict[int, int] = {}
        self.failed: tuple[str, int] = ("", 0)  # the last exchange failure's cause, and how often in a row
        self.sync_s = 0.0  # seconds in rounds (meet, exchange, commit), the method's evaluations left out
        self.first_round, self.launched = -1, 0

    # ---- joining and leaving -----------------------------------------------------------------------
    def join(self, info: dict, heartbeat_s: float, joiner: bool) -> int:
        """Register with the job (a new worker id) and keep a heartbeat; the id."""
        self.id = self.ask(lambda: self.members.register(info))
        self.members.start_heartbeat(heartbeat_s)
        self.first_round, self.launched = self.ask(self.members.launched)
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

    def resume_at(self, version: int, round_no: int, epoch: int, from_checkpoint: bool) -> None:
        """Start from a checkpoint of the job's: its version, the round after it, the epoch it began. What this
        worker trained before (a stopped worker's stale steps) is neither contributed nor counted."""
        self.version, self.next_round, self.epoch, self.cursor = version, round_no, epoch, 0
        self.epoch_loss, self.epoch_steps = 0.0, 0
        self.received_at = self.round_at = self.progress()
        self.from_checkpoint = from_checkpoint

    # ---- the outer step ----------------------------------------------------------------------------
    def outer_step(self, exchange: Exchange | None, state: OuterState) -> None:
        """Meet, exchange, vote and commit a round (again until one commits); nothing once the job has finished."""
        t0, busy0 = time.perf_counter(), self.busy()
        try:
            self._catch_up()
            while True:
                q = self._meet(state)
                if q is None:
                    self.log.info(f"worker {self.id}: the job has finished")
                    self.q = None
                    return
                outcome, payload = self._exchange(q, exchange, state)
                if outcome == COMMIT:
                    self._commit(q, state, payload, outer=exchange is not None and bool(q.contributors))
                    return
        finally:
            self.sync_s += time.perf_counter() - t0 - (self.busy() - busy0)

    # ---- meet --------------------------------------------------------------------------------------
    def _catch_up(self) -> None:
        """Tell `behind` when rounds were committed without this worker since its last."""
        try:
            behind = self.members.current_round() > self.next_round
        except redis.RedisError:
            return  # the coordinator is away: the meeting waits for it
        if behind:
            self.behind()

    def _arrival(self, state: OuterState) -> Arrival:
        # a joiner that read θ_global from a checkpoint never counts as holding the job's: it receives it,
        # unless nobody who holds it is left (then it is the source and the job goes on from the checkpoint)
        mark = fingerprint(state) + ("~checkpoint" if self.from_checkpoint else "")
        steps, loss = self.progress()
        return Arrival(self.version, mark, steps - self.received_at[0], steps - self.round_at[0],
                       loss - self.round_at[1], self.epoch, self.cursor, self.epoch_loss, self.epoch_steps,
                       next_stop=state.steps_to_sync())

    def _meet(self, state: OuterState) -> Decision | None:
        """Arrive at the newest round and wait for its quorum to include this worker; None once the job
        has finished. A quorum decided without this worker (it came late, or the quorum was full) sends
        it to the next round once that one commits, or to the next attempt once it aborts. Patience
        (timeout_s) counts from this worker's arrival at each round and attempt."""
        at, since, said, arrival = None, time.monotonic(), 0.0, self._arrival(state)
        while True:
            try:
                if self.members.status() == "finished":
                    return None
                r = max(self.next_round, self.members.current_round())
                a = max(self.attempts.get(r, 0), self.members.current_attempt(r))
                if (r, a) != at:
                    at, since = (r, a), time.monotonic()
                self.members.reach(r)
                self.members.arrive(r, a, arrival)
                q = self.members.quorum(r, a) or self._decide(r, a, since)
                if q is not None and self._settled(q):
                    continue
            except redis.RedisError:
                q = None  # the coordinator is away (restarting): keep trying
            if q is not None and self.id in q.members:
                return q
            if time.monotonic() - since > self.patience.wait_s:
                raise Unavailable(f"worker {self.id} waited {self.patience.wait_s:g} s (elastic.wait_s) at round "
                                  f"{at} without a quorum ({self._waiting_for()}); giving up")
            if time.monotonic() - since > 5 and time.monotonic() - said > 10:  # after 5 s, then every 10 s
                self.log.info(f"worker {self.id}: waiting for a quorum ({self._waiting_for()})")
                said = time.monotonic()
            time.sleep(0.02)

    def _settled(self, q: Decision) -> bool:
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
        if live < self.patience.min_workers:
            return f"{live} worker(s) alive, elastic.min_workers={self.patience.min_workers}"
        return f"{live} worker(s) alive; the round's members are still training or the quorum is full"

    def _decide(self, r: int, a: int, since: float) -> Decision | None:
        """Propose the quorum once every live worker has arrived, or `timeout_s` has passed with at
        least `min_workers` arrived; None while neither holds. A worker holding a checkpoint's θ_global
        (a joiner, a resumed job) waits for every live worker however long: it would otherwise go on
        from the checkpoint beside workers that hold a newer θ_global (a fork; one side's rounds lost)."""
        arrivals, live = self.members.arrivals(r, a), self.members.live()
        present = {w: arrival for w, arrival in arrivals.items() if w in live}
        if len(present) < self.patience.min_workers or self.id not in present:
            return None
        patient = time.monotonic() - since < self.patience.timeout_s
        if patient and (not live <= set(present) or (r == self.first_round and len(present) < self.launched)):
            return None  # a live worker is still training, or the workers launched together are still starting
        if self.from_checkpoint and not live <= set(present):
            return None  # a checkpoint's θ_global is not the job's while a live worker may hold a newer one:
            #              never a quorum without it (after a coordinator's restart, one still in an
            #              exchange arrives when that fails; one that left drops out of `live`)
        p = self.plan
        return self.members.propose(decide(r, a, present, p.samples, p.batch, p.epochs, self.patience.max_workers))

    # ---- exchange ----------------------------------------------------------------------------------
    def _group(self, q: Decision, name: str, workers: list[int], opened: list) -> Communicator:
        """A gloo group of `workers` (ranks in that order) on this quorum's own rendezvous keys; its
        store goes into `opened`, closed when the exchange ends."""
        prefix = self.members.key("pg", q.round, q.attempt, q.nonce, name)
        store = RedisStore(self.members.url, prefix, self.patience.timeout_s,
                           alive=lambda: set(workers) <= self.members.live())
        opened.append(store)
        return Communicator.over_store(store, workers.index(self.id), len(workers), torch.device("cpu"),
                                       self.patience.timeout_s, self.ledger, host=self.host)

    def ask(self, call):
        """call() once the coordinator answers (it may be restarting); Unavailable after wait_s."""
        answer = wait_until(lambda: (call(),), self.patience.wait_s, poll_s=0.2)
        if answer is None:
            raise Unavailable(f"worker: the elastic coordinator {self.members.url} stayed away "
                              f"{self.patience.wait_s:g} s (elastic.wait_s)")
        return answer[0]

    def _exchange(self, q: Decision, exchange: Exchange | None, state: OuterState) -> tuple[str, bytes | None]:
        """The round's collective (the members that agree) and the state's transfer (to the receivers), then
        the vote; undone unless it commits. Returns the outcome and what a receiver received."""
        takes_part = exchange is not None and bool(q.contributors) and self.id not in q.receivers
        saved = state.snapshot() if takes_part else None
        opened: list[RedisStore] = []
        ok, cause, payload = True, "", None
        try:
            self.fault(q.round, "exchange")
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
        self._publish_bytes()  # before the vote: a committed round's record counts every member's bytes of it
        outcome = self._outcome(q, ok)
        self._count_failure(q, cause if not ok else None)
        if outcome != COMMIT:
            if saved is not None:
                state.restore(saved)
            self.attempts[q.round] = q.attempt + 1
            with contextlib.suppress(redis.RedisError):
                self.members.next_attempt(q.round, q.attempt + 1)
        return outcome, payload

    def _transfer(self, q: Decision, state: OuterState, opened: list) -> bytes | None:
        """The source's shared state and handover to the receivers, over a group of their own, as bytes."""
        comm = self._group(q, "join", [q.members[0]] + q.receivers, opened)
        source = self.id == q.members[0]
        data = pack_state({"shared": state.shared_state(), "extra": state.handover()}) if source else None
        received = comm.broadcast_bytes(data, src=0, tag="join")
        comm.close()
        return None if source else received

    def _count_failure(self, q: Decision, cause: str | None) -> None:
        """Count this worker's failed exchanges in a row by cause (None: this one went through); give up at
        max_failed_rounds of the same cause, or a joiner at its first (see the module doc)."""
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
        if count >= self.patience.max_failed_rounds:
            message = (f"round {q.round} failed {count} times in a row for the same cause ({cause}); "
                       f"elastic.max_failed_rounds={self.patience.max_failed_rounds}: the job stops")
            if not self._first_to_give_up():
                self.leave()
                self.quit(Unavailable.exit_code)  # another worker says it, once
            raise Unavailable(message)

    def _first_to_give_up(self) -> bool:
        """Whether no other worker of the job has given up before this one (then this one says why)."""
        try:
            return bool(self.members.r.set(self.members.key("gave_up"), self.id, nx=True, ex=86_400))
        except redis.RedisError:
            return True

    def _outcome(self, q: Decision, ok: bool) -> str:
        """Vote, then wait for the round's outcome as the coordinator holds it (never decided here
        alone: the others may have read another). A member that dies or votes fail aborts it; the
        wait is bounded by wait_s, after which this worker aborts it in the coordinator."""
        wait_s = self.patience.wait_s
        wait_until(lambda: self.members.vote(q, ok), wait_s, poll_s=0.2)
        outcome = wait_until(lambda: self.members.outcome(q), wait_s)
        if outcome is None:
            outcome = wait_until(lambda: self.members.abort(q), wait_s, poll_s=0.2)
        if outcome is None:
            raise Unavailable(f"worker {self.id}: the coordinator {self.members.url} stayed away {wait_s:g} s "
                              "(elastic.wait_s)")
        return outcome

    # ---- commit ------------------------------------------------------------------------------------
    def _commit(self, q: Decision, state: OuterState, payload: bytes | None, outer: bool) -> None:
        if payload is not None:  # a receiver: the source's state, and θ_global in the local model
            got = unpack_state(payload)
            state.receive(got["shared"], got["extra"])
            self.received_at = self.progress()
            self.log.info(f"worker {self.id}: received θ_global of round {q.round} (version {q.version})")
        self.version, self.next_round, self.from_checkpoint, self.joiner = q.version + 1, q.round + 1, False, False
        with contextlib.suppress(redis.RedisError):
            self.members.reach(self.next_round)
        self.round_at = self.progress()
        self.epoch, self.cursor = q.epoch, q.next_cursor
        self.epoch_loss, self.epoch_steps = q.epoch_loss, q.epoch_steps
        self.q, self.rounds = q, self.rounds + 1
        if q.epoch_end >= 0:
            self.ended = q
        self.committed(q, outer)

    def _publish_bytes(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.members.publish_ledger(self.ledger.traffic_by_tag())

    def is_source(self) -> bool:
        """Whether this worker is the source of the round it last committed (it writes the job's files)."""
        return self.q is not None and self.q.members[0] == self.id

