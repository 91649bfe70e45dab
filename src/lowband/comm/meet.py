"""Where and when an elastic worker meets the others: the round it meets next, and how long it waits.

`Meet` is the waiting half of an elastic job's quorum (comm/elastic_quorum.py; comm/membership.py keeps
the keys in Redis). A worker arrives at the job's newest round with what it holds and waits until a quorum
of that round includes it. The first worker to see that every live worker has arrived (or that
`timeout_s` passed with `min_workers` there) decides the quorum (`membership.decide`, with the worker's
plan) and proposes it; the first proposal holds. A quorum decided without this worker sends it on to the
next round once that one commits, or to the next attempt once it aborts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from lowband.comm.membership import ABORT, COMMIT, Arrival, Decision, Membership, Plan, decide
from lowband.errors import Unavailable


@dataclass(frozen=True)
class Patience:
    """How long a worker waits, and how few it trains with (elastic.* in the config)."""

    min_workers: int = 1
    max_workers: int = 0
    timeout_s: float = 30.0  # for a quorum to form with fewer than every live worker; a collective's timeout
    wait_s: float = 600.0  # for the coordinator, a vote, a quorum with min_workers
    max_failed_rounds: int = 5


class Meet:
    """One worker's way to its next round: `next_round`, the attempt of each round, and the waiting rule."""

    def __init__(self, members: Membership, patience: Patience, log: logging.Logger):
        self.members, self.patience, self.log = members, patience, log
        self.id = -1
        self.next_round = 0  # the round met next
        self.attempts: dict[int, int] = {}  # round -> the attempt this worker meets it at
        self.first_round, self.launched = -1, 0  # the round the launched workers start at, and how many

    def behind(self) -> bool:
        """Whether rounds were committed without this worker since its last (False while Redis is away)."""
        try:
            return self.members.current_round() > self.next_round
        except redis.RedisError:
            return False

    def wait(self, arrival: Callable[[], Arrival], plan: Plan, from_checkpoint: bool) -> Decision | None:
        """Arrive at the newest round and wait for its quorum to include this worker; None once the job
        has finished. Patience (timeout_s) counts from this worker's arrival at each round and attempt."""
        at, since, said, brought = None, time.monotonic(), 0.0, arrival()
        while True:
            try:
                if self.members.status() == "finished":
                    return None
                r = max(self.next_round, self.members.current_round())
                a = max(self.attempts.get(r, 0), self.members.current_attempt(r))
                if (r, a) != at:
                    at, since = (r, a), time.monotonic()
                self.members.reach(r)
                self.members.arrive(r, a, brought)
                q = self.members.quorum(r, a) or self.decide(r, a, since, plan, from_checkpoint)
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

    def decide(self, r: int, a: int, since: float, plan: Plan, from_checkpoint: bool) -> Decision | None:
        """Propose the quorum once every live worker has arrived, or `timeout_s` has passed with at
        least `min_workers` arrived; None while neither holds. A worker holding a checkpoint's θ_global
        (`from_checkpoint`: a joiner, a resumed job) waits for every live worker however long: it would
        otherwise go on from the checkpoint beside workers that hold a newer θ_global (a fork; one side's
        rounds lost)."""
        arrivals, live = self.members.arrivals(r, a), self.members.live()
        present = {w: arrival for w, arrival in arrivals.items() if w in live}
        if len(present) < self.patience.min_workers or self.id not in present:
            return None
        patient = time.monotonic() - since < self.patience.timeout_s
        if patient and (not live <= set(present) or (r == self.first_round and len(present) < self.launched)):
            return None  # a live worker is still training, or the workers launched together are still starting
        if from_checkpoint and not live <= set(present):
            return None  # a checkpoint's θ_global is not the job's while a live worker may hold a newer one:
            #              never a quorum without it (after a coordinator's restart, one still in an
            #              exchange arrives when that fails; one that left drops out of `live`)
        return self.members.propose(decide(r, a, present, self.patience.max_workers, plan))

    def committed(self, q: Decision) -> None:
        """Round `q` committed with this worker: the next round is where it meets."""
        self.next_round = q.round + 1
        with contextlib.suppress(redis.RedisError):
            self.members.reach(self.next_round)

    def aborted(self, q: Decision) -> None:
        """Round `q` aborted: meet it again, as its next attempt."""
        self.attempts[q.round] = q.attempt + 1
        with contextlib.suppress(redis.RedisError):
            self.members.next_attempt(q.round, q.attempt + 1)
