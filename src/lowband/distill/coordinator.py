"""The EDL-Dist Coordinator: a registry of teacher servers kept in Redis.

Contract (tests/contract runs it against every Redis we can start):
  register(info)         a key PREFIX:teacher:ID holding the teacher's JSON, expiring after ttl_s
  heartbeat(info)        extends the key; re-creates it if it vanished (Redis restarted, or the key
                         expired during a stall): returns False then
  teachers()             the live teachers (an expired key means the teacher is gone)
  claim(student, n)      atomically assigns up to n live, unassigned teachers to `student`
                         (PREFIX:owner:ID, SET NX with a lease of lease_s)
  renew(student, ids)    extends the student's leases; returns the ids it still holds (re-claims a
                         lease that vanished when the teacher is free)
  release(student, id)   gives a teacher back (only the holder can)
A student that dies stops renewing, so its teachers become free after lease_s. Values are JSON:
nothing is unpickled. Any redis-py URL works (redis://, rediss:// for TLS, a password in the URL).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field

import redis

from lowband.comm.membership import redact
from lowband.errors import UsageError

_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""



def _text(value: bytes | str) -> str:
    """Redis answers bytes (or str when the client decodes); both become str."""
    return value.decode() if isinstance(value, bytes) else value

class CoordinatorUnavailable(UsageError):
    def __init__(self, url: str, why: str):
        super().__init__(f"coordinator {redact(url)} is unreachable ({why}); start Redis there, or leave the "
                         f"URL out to use an embedded one")


@dataclass
class TeacherInfo:
    host: str
    port: int
    model: str = ""
    device: str = "cpu"
    throughput: float = 0.0  # samples/s, measured by the teacher
    id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    pid: int = field(default_factory=os.getpid)

    @classmethod
    def from_json(cls, text: str | bytes) -> TeacherInfo:
        raw = json.loads(text)
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class Coordinator:
    def __init__(self, url: str, ttl_s: float = 5.0, lease_s: float = 5.0, prefix: str = "lowband",
                 timeout_s: float = 2.0):
        self.url, self.ttl_ms, self.lease_ms, self.prefix = url, int(ttl_s * 1000), int(lease_s * 1000), prefix
        try:
            self.r = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        except ValueError as e:
            raise UsageError(f"coordinator URL {redact(url)!r} does not parse ({e}); expected redis://HOST:PORT/DB") from None
        self._renew, self._release = self.r.register_script(_RENEW), self.r.register_script(_RELEASE)

    def ping(self) -> None:
        """Raise CoordinatorUnavailable unless Redis answers."""
        try:
            self.r.ping()
        except redis.RedisError as e:
            raise CoordinatorUnavailable(self.url, f"{type(e).__name__}: {e}") from None

    def _tkey(self, tid: str) -> str:
        return f"{self.prefix}:teacher:{tid}"

    def _okey(self, tid: str) -> str:
        return f"{self.prefix}:owner:{tid}"

    # ---- teachers ---------------------------------------------------------------------------
    def register(self, info: TeacherInfo) -> None:
        self.r.set(self._tkey(info.id), json.dumps(asdict(info)), px=self.ttl_ms)

    def heartbeat(self, info: TeacherInfo) -> bool:
        """Extend the registration; False when it had vanished and was made again."""
        if self.r.set(self._tkey(info.id), json.dumps(asdict(info)), px=self.ttl_ms, xx=True):
            return True
        self.register(info)
        return False

    def unregister(self, tid: str) -> None:
        self.r.delete(self._tkey(tid), self._okey(tid))

    def teachers(self) -> list[TeacherInfo]:
        keys = sorted(self.r.scan_iter(match=self._tkey("*"), count=1000))
        values = self.r.mget(keys) if keys else []
        return [TeacherInfo.from_json(v) for v in values if v is not None]

    # ---- assignments ------------------------------------------------------------------------
    def assignments(self) -> dict[str, str]:
        """teacher id -> student holding it."""
        keys = list(self.r.scan_iter(match=self._okey("*"), count=1000))
        values = self.r.mget(keys) if keys else []
        cut = len(self._okey(""))
        return {_text(k)[cut:]: _text(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def free(self, exclude: frozenset[str] | set[str] = frozenset()) -> list[TeacherInfo]:
        """Live teachers nobody holds, fastest first."""
        held = self.assignments()
        free = [t for t in self.teachers() if t.id not in held and t.id not in exclude]
        return sorted(free, key=lambda t: -t.throughput)

    def claim(self, student: str, n: int = 1, exclude: frozenset[str] | set[str] = frozenset()) -> list[TeacherInfo]:
        got: list[TeacherInfo] = []
        for t in self.free(exclude):
            if len(got) >= n:
                break
            if self.r.set(self._okey(t.id), student, nx=True, px=self.lease_ms):
                got.append(t)
        return got

    def renew(self, student: str, tids: list[str]) -> list[str]:
        return [t for t in tids if self._renew(keys=[self._okey(t)], args=[student, self.lease_ms])]

    def release(self, student: str, tid: str) -> None:
        self._release(keys=[self._okey(tid)], args=[student])

    def wait_for(self, n: int, timeout_s: float, poll_s: float = 0.1) -> list[TeacherInfo]:
        """Block until at least n teachers are registered (UsageError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.teachers()
            if len(live) >= n:
                return live
            if time.monotonic() > deadline:
                raise UsageError(f"only {len(live)} of {n} teachers registered in {redact(self.url)} "
                                 f"within {timeout_s:.0f} s")
            time.sleep(poll_s)
