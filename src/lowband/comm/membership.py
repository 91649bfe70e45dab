"""Who is in an elastic job, and who meets at each outer step: membership and quorums in Redis.

An elastic job (training/elastic/worker.py) keeps its membership in the Redis coordinator EDL-Dist uses.
Keys live under `lowband:elastic:JOB:`:

  job                 JSON {status: running | finished, min_workers, max_workers, launched, first_round};
                      the launcher keeps it
  next_id             counter handing out worker ids (0, 1, 2, ... in arrival order)
  member:ID           JSON of a live worker, expiring `dead_after_s` after its last heartbeat
  round               the newest round any worker has reached (a late worker catches up to it)
  attempt:R           the attempt round R is met at (raised after an abort)
  arrive:R:A          hash ID -> Arrival JSON: who came to round R, attempt A
  quorum:R:A          the quorum (a Decision) of round R, attempt A (SET NX: the first decider wins), with a nonce N
  done:R:A:N, fail:R:A:N  who finished that quorum's exchange and who failed it
  outcome:R:A:N       "commit" or "abort", decided once
  ledger              hash ID -> JSON of that worker's bytes sent and received per tag
  record:E            the id of the worker that writes epoch E's record (the first claim holds; a claim
                      whose holder is gone is taken over, so a record is written once whoever dies)

A round: the live workers arrive with what they hold (their version, a fingerprint of θ_global, the
steps they trained since, and what the trainer's plan brings); once every live worker has arrived (or
`timeout_s` passed with at least `min_workers`), the first to look decides the quorum: its members, whose
θ_global is the authority (the highest version), who contributes a pseudo-gradient and who receives the
state; the trainer's plan adds what the round hands each member (an elastic job's data plan,
training/elastic/plan.py: each member's slice of the epoch's data), JSON this module does not read. The
members exchange, then vote: the round commits when every member says done, and aborts when one fails,
or one dies before voting. An aborted round is tried again, without the dead, as attempt A + 1. Nothing
here unpickles: every value is JSON. A Redis that restarts empty loses the round's keys; the workers' own state (versions,
fingerprints, progress) is in every arrival, so the next quorum rebuilds what it needs from them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis

from lowband.errors import Unavailable, UsageError

COMMIT, ABORT = "commit", "abort"


@dataclass
class Arrival:
    """What a worker brings to a round."""

    version: int  # rounds committed into its θ_global (a newcomer holds the initial θ, version 0, or a checkpoint's)
    fingerprint: str  # of its outer state, so two holders of one version can tell they agree
    trained: int = 0  # steps trained since it last took θ_global from another (received, started): a pseudo-gradient
    plan: dict = field(default_factory=dict)  # what the trainer's plan brings (its data progress), JSON

    @classmethod
    def from_json(cls, text: str | bytes) -> Arrival:
        raw = json.loads(text)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@dataclass
class Decision:
    """The quorum of one round: its members and what each does in it."""

    round: int
    attempt: int
    members: list[int]  # worker ids; members[0] is the source, whose θ_global is the authority
    contributors: list[int]  # members with a pseudo-gradient from the source's θ_global
    receivers: list[int]  # members whose θ_global differs from the source's: they receive its state
    version: int  # the source's version
    plan: dict = field(default_factory=dict)  # what the trainer's plan hands the members for the round, JSON
    nonce: str = ""  # set when proposed: this quorum's votes and rendezvous are its own, even if a coordinator
    #                  that restarted empty lets another quorum be proposed for the same round and attempt

    @classmethod
    def from_json(cls, text: str | bytes) -> Decision:
        raw = json.loads(text)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    @property
    def agree(self) -> list[int]:
        """The members that hold the source's θ_global (source first): those that take the outer step."""
        return [w for w in self.members if w not in self.receivers]


#: what a round hands its members, decided with its members: (the round, what each member brought) -> JSON
Plan = Callable[[Decision, dict[int, dict]], dict]


def decide(round_no: int, attempt: int, arrivals: dict[int, Arrival], max_workers: int = 0,
           plan: Plan | None = None) -> Decision:
    """The quorum of these arrivals (a pure function: every decider gets the same answer).

    The source is the arrival with the highest version (ties: the lowest id); members are the source
    and the others, those with a pseudo-gradient to contribute first, then by id, at most `max_workers`
    (0: all). Those that hold the source's θ_global (its version and fingerprint) agree, and contribute
    if they trained; the others receive. `plan` (a pure function too) says what the round hands out."""
    source = min(arrivals, key=lambda w: (-arrivals[w].version, w))
    ref = arrivals[source]

    def agrees(w: int) -> bool:
        return (arrivals[w].version, arrivals[w].fingerprint) == (ref.version, ref.fingerprint)

    others = sorted((w for w in arrivals if w != source), key=lambda w: (not (agrees(w) and arrivals[w].trained), w))
    members = [source] + (others[:max_workers - 1] if max_workers else others)
    agree = [w for w in members if agrees(w)]
    q = Decision(round_no, attempt, members, [w for w in agree if arrivals[w].trained > 0],
                 [w for w in members if w not in agree], ref.version)
    if plan is not None:
        q.plan = plan(q, {w: arrivals[w].plan for w in members})
    return q


KEEP_S = 86_400  # a job's keys outlive its last sign of life by a day


class Membership:
    """One elastic job's membership, quorums and votes in Redis (see the module docstring)."""

    def __init__(self, url: str, job: str, dead_after_s: float = 5.0, timeout_s: float = 2.0):
        self.url, self.job, self.ttl_ms = url, job, int(dead_after_s * 1000)
        try:
            self.r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as e:
            raise UsageError(f"elastic.coordinator {url!r} does not parse ({e}); expected redis://HOST:PORT/DB") from None
        self.worker: int | None = None
        self._beating: threading.Event | None = None

    def key(self, *parts) -> str:
        return ":".join(["lowband", "elastic", self.job, *map(str, parts)])

    # ---- the job ---------------------------------------------------------------------------------
    def ping(self) -> None:
        """Raise UsageError unless the coordinator answers."""
        try:
            self.r.ping()
        except redis.RedisError as e:
            raise UsageError(f"elastic coordinator {redact(self.url)} is unreachable ({type(e).__name__}: {e}); "
                             "start Redis there or leave elastic.coordinator empty for an embedded one") from None

    def publish_job(self, status: str, min_workers: int, max_workers: int, round_no: int | None = None,
                    launched: int = 0) -> None:
        """The job's entry; `launched` workers started together at round `round_no` (its first quorum
        waits for them, so the first to load its data does not start alone)."""
        self.r.set(self.key("job"), json.dumps({"status": status, "min_workers": min_workers,
                                                "max_workers": max_workers, "launched": launched,
                                                "first_round": -1 if round_no is None else round_no}))
        if round_no is not None:
            self.r.set(self.key("round"), round_no)

    def launched(self) -> tuple[int, int]:
        """(the round the launched workers start at, how many were launched); (-1, 0) when unknown."""
        raw = self.r.get(self.key("job"))
        job = json.loads(raw) if raw else {}
        return int(job.get("first_round", -1)), int(job.get("launched", 0))

    def status(self) -> str | None:
        """running | finished, or None when the coordinator holds no such job."""
        raw = self.r.get(self.key("job"))
        return json.loads(raw)["status"] if raw else None

    def keep_for(self, seconds: int = KEEP_S) -> None:
        """Let the job's keys expire `seconds` from now unless this is called again (the launcher calls it
        while the job runs): a job whose launcher was killed leaves nothing in a shared Redis for good.
        Keys with a shorter life of their own (members' heartbeats, rendezvous keys) keep it."""
        own = (self.key("member", "").encode(), self.key("pg", "").encode())
        for key in self.r.scan_iter(match=self.key("*"), count=500):
            if not key.startswith(own):
                self.r.expire(key, seconds)

    def finish(self) -> None:
        """Mark the job finished; its keys expire a day later (a shared Redis keeps no job forever)."""
        raw = self.r.get(self.key("job"))
        job = json.loads(raw) if raw else {"min_workers": 1, "max_workers": 0}
        self.r.set(self.key("job"), json.dumps({**job, "status": "finished"}), ex=86_400)
        for name in ("round", "next_id", "ledger"):
            self.r.expire(self.key(name), 86_400)

    # ---- members ---------------------------------------------------------------------------------
    def register(self, info: dict) -> int:
        """A new worker id, registered as live: the next id of the counter whose member key is free (a
        coordinator that restarted empty counts from 0 again until the live workers' heartbeats raise it)."""
        while True:
            worker = int(self.r.incr(self.key("next_id"))) - 1
            self.info = {**info, "id": worker}
            if self.r.set(self.key("member", worker), json.dumps(self.info), px=self.ttl_ms, nx=True):
                self.worker = worker
                return worker

    def heartbeat(self) -> None:
        """Extend this worker's registration (made again if the coordinator lost it), and keep the id
        counter past this worker's id."""
        assert self.worker is not None, "register first"
        self.r.set(self.key("member", self.worker), json.dumps(self.info), px=self.ttl_ms)
        self._raise(self.key("next_id"), self.worker + 1)

    def start_heartbeat(self, every_s: float) -> None:
        """Heartbeats from a daemon thread; a coordinator that is briefly away is retried, not fatal."""
        self._beating = stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every_s):
                with contextlib.suppress(redis.RedisError):
                    self.heartbeat()
        threading.Thread(target=beat, name="lowband-heartbeat", daemon=True).start()

    def leave(self) -> None:
        if self._beating is not None:
            self._beating.set()
        if self.worker is not None:
            with contextlib.suppress(redis.RedisError):
                self.r.delete(self.key("member", self.worker))

    def live(self) -> set[int]:
        prefix = self.key("member", "")
        return {int(k.decode()[len(prefix):]) for k in self.r.scan_iter(match=prefix + "*", count=1000)}

    def members_info(self) -> list[dict]:
        keys = sorted(self.r.scan_iter(match=self.key("member", "*"), count=1000))
        return [json.loads(v) for v in (self.r.mget(keys) if keys else []) if v is not None]

    # ---- rounds ----------------------------------------------------------------------------------
    def current_round(self) -> int:
        raw = self.r.get(self.key("round"))
        return int(raw) if raw is not None else 0

    def _raise(self, key: str, value: int) -> None:
        """Set an integer key to `value` unless it holds a larger one."""
        self.r.eval("local v = tonumber(redis.call('GET', KEYS[1]) or '-1') "
                    "if v < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end return 0",
                    1, key, value)

    def reach(self, round_no: int) -> None:
        """Raise the job's newest round to `round_no` (never lower it)."""
        self._raise(self.key("round"), round_no)

    def current_attempt(self, round_no: int) -> int:
        raw = self.r.get(self.key("attempt", round_no))
        return int(raw) if raw is not None else 0

    def next_attempt(self, round_no: int, attempt: int) -> None:
        """After an aborted attempt: the round is met again as `attempt`."""
        self._raise(self.key("attempt", round_no), attempt)
        self.r.expire(self.key("attempt", round_no), 3_600)

    def arrive(self, round_no: int, attempt: int, arrival: Arrival) -> None:
        key = self.key("arrive", round_no, attempt)
        self.r.hset(key, str(self.worker), json.dumps(asdict(arrival)))
        self.r.pexpire(key, 3_600_000)

    def arrivals(self, round_no: int, attempt: int) -> dict[int, Arrival]:
        raw = self.r.hgetall(self.key("arrive", round_no, attempt))
        return {int(k): Arrival.from_json(v) for k, v in raw.items()}

    def quorum(self, round_no: int, attempt: int) -> Decision | None:
        raw = self.r.get(self.key("quorum", round_no, attempt))
        return Decision.from_json(raw) if raw else None

    def propose(self, q: Decision) -> Decision:
        """Store `q` unless a quorum for its round and attempt exists; returns the one that holds."""
        key = self.key("quorum", q.round, q.attempt)
        q.nonce = uuid.uuid4().hex[:12]
        self.r.set(key, json.dumps(asdict(q)), nx=True, px=3_600_000)
        held = self.quorum(q.round, q.attempt)
        return held if held is not None else q

    # ---- votes -----------------------------------------------------------------------------------
    def _vote_key(self, name: str, q: Decision) -> str:
        return self.key(name, q.round, q.attempt, q.nonce)

    def vote(self, q: Decision, ok: bool) -> bool:
        key = self._vote_key("done" if ok else "fail", q)
        self.r.sadd(key, str(self.worker))
        self.r.pexpire(key, 3_600_000)
        return True

    def outcome(self, q: Decision) -> str | None:
        """The round's outcome when it can be told: abort on a failure vote or a member gone silent,
        commit when every member voted done; None while undecided. Decided once, by whoever tells first."""
        key = self._vote_key("outcome", q)
        held = self.r.get(key)
        if held is not None:
            return _text(held)
        done = {int(w) for w in self.r.smembers(self._vote_key("done", q))}
        failed = self.r.scard(self._vote_key("fail", q))
        if not failed and set(q.members) <= done:
            verdict = COMMIT
        elif failed or (set(q.members) - done) - self.live():
            verdict = ABORT
        else:
            return None
        return self._settle(key, verdict)

    def abort(self, q: Decision) -> str:
        """Abort the round unless its outcome is decided; returns the outcome that holds."""
        return self._settle(self._vote_key("outcome", q), ABORT)

    def settle(self, q: Decision, ok: bool, wait_s: float, worker: int) -> str:
        """Vote, then wait for the round's outcome as the coordinator holds it (never decided by one worker
        alone: the others may have read another). A member that dies or votes fail aborts it; the wait is
        bounded by wait_s, after which this worker aborts it in the coordinator."""
        wait_until(lambda: self.vote(q, ok), wait_s, poll_s=0.2)
        outcome = wait_until(lambda: self.outcome(q), wait_s)
        if outcome is None:
            outcome = wait_until(lambda: self.abort(q), wait_s, poll_s=0.2)
        if outcome is None:
            raise Unavailable(f"worker {worker}: the coordinator {redact(self.url)} stayed away {wait_s:g} s "
                              "(elastic.wait_s)")
        return outcome

    def decided(self, q: Decision) -> str | None:
        """The round's stored outcome, or None while undecided (nothing is decided here)."""
        held = self.r.get(self._vote_key("outcome", q))
        return None if held is None else _text(held)

    def _settle(self, key: str, verdict: str) -> str:
        """Store `verdict` unless an outcome is stored; the one that holds (ours if Redis lost it again)."""
        self.r.set(key, verdict, nx=True, px=3_600_000)
        held = self.r.get(key)
        return verdict if held is None else _text(held)

    # ---- who writes an epoch's record ---------------------------------------------------------------
    def record_holder(self, epoch: int) -> int | None:
        """The worker that claimed the writing of epoch `epoch`'s record (None: nobody yet)."""
        raw = self.r.get(self.key("record", epoch))
        return int(raw) if raw is not None else None

    def claim_record(self, epoch: int, take: bool = False) -> int | None:
        """Claim the writing of epoch `epoch`'s record for this worker (SET NX: the first claim holds; `take`:
        overwrite a claim whose holder is gone). The holder's id after the attempt (None: no claim)."""
        key = self.key("record", epoch)
        self.r.set(key, str(self.worker), nx=not take, ex=KEEP_S)
        raw = self.r.get(key)
        return int(raw) if raw is not None else None

    # ---- bytes -----------------------------------------------------------------------------------
    def publish_ledger(self, by_tag: dict, entry: str | None = None) -> None:
        """This worker's bytes by tag, {tag: {"sent": n, "recv": n}} (or, under `entry`, bytes of another
        origin: a resumed job's past)."""
        self.r.hset(self.key("ledger"), entry or str(self.worker), json.dumps(by_tag))

    def ledgers(self) -> dict[str, dict]:
        """Each worker's (and each other entry's) bytes by tag, as published."""
        return {_text(k): json.loads(v) for k, v in self.r.hgetall(self.key("ledger")).items()}


def _text(value) -> str:
    """Redis answers bytes (or str when the client decodes); both become str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def redact(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':' if user else ':'}***@{host}"


def wait_until(check, timeout_s: float, poll_s: float = 0.02):
    """Call `check()` until it returns something other than None, a RedisError counting as None (a
    coordinator restarting); None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
        except redis.RedisError:
            got = None
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(poll_s)
