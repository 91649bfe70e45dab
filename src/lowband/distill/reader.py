"""DistilReader: feeds one student rank with (x, y, soft labels) computed by remote teachers.

EDL-Dist (Dong et al., "Elastic Deep Learning using Knowledge Distillation with Heterogeneous
Computing Resources"), sections 3.1-3.4. The reader reads the rank's own minibatches (in the
order the trainer would use them), streams their inputs to the teachers the Coordinator assigned
it, and keeps the answers in a bounded buffer. The student takes batches strictly in order, so a
run's result does not depend on which teacher answered what.

Hybrid scheduling (Algorithm 1): start with enough teachers to match the student's measured
throughput (`initial_teachers`); when the buffer holds more than `ut` unused batches stop sending,
below `lt` resume; while the student is starving ask the Coordinator for one more teacher.
Fault tolerance: a teacher that fails has its in-flight batches re-sent to the others, first;
with no teacher at all the student waits (saying so) up to `wait_s`, then fails.
Every batch is delivered exactly once: a batch is either queued, in flight at exactly one
teacher, or in the buffer, and a failed link's late answers are never read.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import math
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

import torch

from lowband.comm.ledger import Tally, Traffic
from lowband.distill import wire
from lowband.distill.coordinator import Coordinator, TeacherInfo, redact
from lowband.distill.link import TeacherLink
from lowband.errors import Unavailable


class TeacherUnavailable(Unavailable):
    """No teacher answered for longer than the configured wait."""


def initial_teachers(student_rate: float, teacher_rates: list[float], most: int) -> int:
    """How many of the offered teachers (fastest first) together keep up with the student.

    With equal teachers this is ceil(student_rate / teacher_rate): the reading of the paper's
    n = t_t / t_s that keeps the student fed. At least 1, at most `most`.
    """
    total, n = 0.0, 0
    for rate in sorted(teacher_rates, reverse=True):
        if n >= most or (n and total >= student_rate):
            break
        total, n = total + rate, n + 1
    if n < most and total < student_rate and teacher_rates:  # unknown rates: assume the slowest
        n = min(most, n + math.ceil((student_rate - total) / max(min(teacher_rates), 1e-9)))
    return max(1, min(n, most))


def next_sending(sending: bool, volume: int, lt: int, ut: int) -> bool:
    """Algorithm 1's hysteresis: stop above ut, resume below lt, otherwise keep the current state."""
    if volume > ut:
        return False
    if volume < lt:
        return True
    return sending


@dataclass
class Item:
    """One student minibatch."""

    key: tuple[int, int]  # (epoch, step)
    x: torch.Tensor = field(repr=False)
    y: torch.Tensor = field(repr=False)
    ids: torch.Tensor = field(repr=False)


@dataclass(order=True)
class Request:
    """What one frame to a teacher carries: `group` consecutive minibatches, inputs concatenated."""

    seq: int
    parts: list[Item] = field(compare=False)
    x: torch.Tensor = field(compare=False, repr=False)

    @classmethod
    def of(cls, seq: int, parts: list[Item]) -> Request:
        return cls(seq, parts, parts[0].x if len(parts) == 1 else torch.cat([p.x for p in parts]))


@dataclass
class ReaderConfig:
    ut: int = 32
    lt: int = 8
    depth: int = 2
    initial: int = 0          # teachers to claim at start; 0: from measured throughputs
    max_teachers: int = 8
    wait_s: float = 300.0     # how long to wait with no teacher before failing
    request_timeout_s: float = 30.0
    group: int = 4            # minibatches per request (fewer, larger frames and teacher batches)
    starve_grow_s: float = 0.5  # waiting over half of such a window asks for one more teacher
    retry_failed_s: float = 10.0  # a failed teacher is not claimed again for this long
    token: str | None = None


class DistilReader:
    def __init__(self, coord: Coordinator, student: str, in_shape, num_classes: int, cfg: ReaderConfig,
                 log: logging.Logger, student_rate: float = 0.0):
        self.coord, self.student, self.cfg, self.log = coord, student, cfg, log
        self.in_shape, self.num_classes, self.student_rate = tuple(in_shape), num_classes, student_rate
        self.limits = wire.Limits(max_payload=4 * num_classes * 1_000_000)
        # one lock, two conditions: the student waits for `arrived`, the links for `work`, so that
        # a step wakes no sender unless sending resumes (thread wake-ups cost the student's core)
        self.cv = threading.Condition()
        self.work = threading.Condition(self.cv)  # type: ignore[arg-type]  # a Condition is a lock too
        self._stopped = threading.Event()
        self.sources: deque = deque()         # (epoch, iterator of (x, y, ids)), in order
        self.fed: set[int] = set()
        self.resend: list[Request] = []       # kept sorted: re-sent first, oldest first
        self.ready: dict[tuple[int, int], tuple[Item, torch.Tensor]] = {}
        self.links: dict[str, TeacherLink] = {}
        self.owned: set[str] = set()          # teachers this student holds a lease on (others are shared)
        self.failed: dict[str, float] = {}
        self.sending, self.closed = True, False
        self.starving_since: float | None = None
        self.seq = itertools.count()
        self.stats = {"batches_sent": 0, "resent": 0, "teacher_failures": 0, "teachers_added": 0,
                      "starved_s": 0.0}
        self.moved = Tally()  # bytes sent to and received from teachers since the student last took them
        self.timeline: list[dict] = []
        self._warned: dict[str, float] = {}
        self._t0 = time.monotonic()
        self.manager = threading.Thread(target=self._manage, name="distil-reader", daemon=True)
        self.manager.start()

    # ---- what the student calls ------------------------------------------------------------------
    def feed(self, epoch: int, batches) -> None:
        """Queue an epoch's minibatches (`data.Batch`es); feeding the next epoch early lets prefetch cross epochs."""
        with self.cv:
            if epoch not in self.fed:
                self.fed.add(epoch)
                self.sources.append((epoch, enumerate(batches)))
                self.work.notify_all()

    def get(self, epoch: int, step: int) -> tuple[Item, torch.Tensor]:
        """Batch `step` of `epoch` with its teacher logits; blocks until it is there."""
        key, t0 = (epoch, step), time.monotonic()
        with self.cv:
            while key not in self.ready:
                if self.starving_since is None:
                    self.starving_since = time.monotonic()
                self._check_waiting(t0)
                self.cv.wait(0.1)
            self.starving_since = None
            self.stats["starved_s"] += time.monotonic() - t0
            got = self.ready.pop(key)
            if not self.sending and len(self.ready) < self.cfg.lt:
                self.work.notify_all()
            return got

    def _check_waiting(self, t0: float) -> None:
        waited = time.monotonic() - t0
        if self.links or waited < 2.0:
            return
        if waited > self.cfg.wait_s:
            raise TeacherUnavailable(f"no teacher for {waited:.0f} s (method.teacher_timeout_s = {self.cfg.wait_s:g}); "
                                     f"none alive and free in {redact(self.coord.url)}")
        self._warn_every("waiting", f"waiting for a teacher: none alive and free in {redact(self.coord.url)} "
                                    f"({waited:.0f} s of at most {self.cfg.wait_s:g} s; start one with `lowband teacher`)")

    # ---- what the links call ---------------------------------------------------------------------
    def next_to_send(self, link: TeacherLink) -> Request | None:
        """The next batch for `link` to send, recorded as in flight there; None: nothing to send now."""
        with self.cv:
            if self.closed or link.closed:
                return None
            item = self._next_item()
            if item is not None:
                link.inflight.append(item)
                self.stats["batches_sent"] += len(item.parts)
            return item

    def _next_item(self) -> Request | None:
        if self.resend:  # in-flight work of a failed teacher goes first, even when the buffer is full
            return self.resend.pop(0)
        self.sending = next_sending(self.sending, len(self.ready), self.cfg.lt, self.cfg.ut)
        while self.sending and self.sources:
            epoch, it = self.sources[0]
            parts = []
            for step, batch in itertools.islice(it, self.cfg.group):
                parts.append(Item((epoch, step), batch.x, batch.y, batch.ids))
            if len(parts) < self.cfg.group:
                self.sources.popleft()  # this epoch is all read
            if parts:
                return Request.of(next(self.seq), parts)
        return None

    def deliver(self, link: TeacherLink, logits: torch.Tensor) -> None:
        """The answer to `link`'s oldest in-flight batch; dropped if the link failed meanwhile (re-sent)."""
        with self.cv:
            if link.closed or not link.inflight:
                return
            request = link.inflight.popleft()
            for part, out in zip(request.parts, logits.split([len(p.x) for p in request.parts]), strict=True):
                self.ready[part.key] = (part, out)
            self.cv.notify_all()

    def wait_for_work(self) -> None:
        with self.cv:
            self.work.wait(0.05)

    def add_bytes(self, sent: int = 0, recv: int = 0) -> None:
        self.moved.add(sent, recv)

    def take_bytes(self) -> Traffic:
        """The bytes sent and received since the last call; the student counts them in its ledger
        (lowband.distill.sources), so the reader keeps no totals of its own."""
        return self.moved.take(with_inter=False)

    def link_failed(self, link: TeacherLink, error: Exception) -> None:
        with self.cv:
            if self.links.get(link.info.id) is not link:
                return
            del self.links[link.info.id]
            link.closed = True  # from here on its answers are dropped: its batches are re-sent
            items = list(link.inflight)
            link.inflight.clear()
            for request in items:
                bisect.insort(self.resend, request)
            self.stats["resent"] += sum(len(r.parts) for r in items)
            self.stats["teacher_failures"] += 1
            self.failed[link.info.id] = time.monotonic()
            self.work.notify_all()
        link.close()
        self.log.warning(f"teacher {link.info.id} failed ({type(error).__name__}: {error}); "
                         f"re-sending its {sum(len(r.parts) for r in items)} in-flight batch(es) to other teachers")
        self._release(link.info.id)

    # ---- the scheduler ---------------------------------------------------------------------------
    def _manage(self) -> None:
        last_renew, last_sample = 0.0, 0.0
        window = (time.monotonic(), 0.0)  # (since, starved seconds then): how hungry the student has been
        while not self.closed:
            now = time.monotonic()
            try:
                if now - last_renew > self.coord.lease_ms / 3000:
                    last_renew = now
                    self._renew()
                if not self.links:
                    self._claim(self._first_count())
                    if not self.links:
                        self._share()
                    window = (now, self._starved())
                elif now - window[0] > self.cfg.starve_grow_s:
                    hungry = (self._starved() - window[1]) / (now - window[0]) > 0.5
                    if hungry and len(self.links) < self.cfg.max_teachers:  # Algorithm 1: volume 0 -> one more
                        self._claim(1)
                    window = (now, self._starved())
            except Exception as e:  # Redis down: carry on with the teachers we hold
                self._note_coordinator_down(e)
            if now - last_sample > 0.25:
                last_sample = now
                self._sample()
            self._stopped.wait(0.05)

    def _starved(self) -> float:
        """Seconds the student has waited for batches so far, including a wait in progress."""
        since = self.starving_since
        return self.stats["starved_s"] + (0.0 if since is None else time.monotonic() - since)

    def _first_count(self) -> int:
        if self.cfg.initial:
            return self.cfg.initial
        rates = [t.throughput for t in self.coord.free(self._excluded())]
        return initial_teachers(self.student_rate, rates, self.cfg.max_teachers) if rates else 1

    def _excluded(self) -> set[str]:
        now = time.monotonic()
        return {t for t, at in self.failed.items() if now - at < self.cfg.retry_failed_s} | set(self.links)

    def _claim(self, n: int) -> None:
        for info in self.coord.claim(self.student, n, exclude=self._excluded()):
            self.owned.add(info.id)
            self._connect(info, owned=True)

    def _share(self) -> None:
        """No teacher is free: use a busy one alongside its holder (spread over students by name)."""
        live = [t for t in self.coord.teachers() if t.id not in self._excluded()]
        if live:
            pick = live[zlib.crc32(self.student.encode()) % len(live)]
            self.log.info(f"no free teacher; sharing teacher {pick.id} with its holder")
            self._connect(pick, owned=False)

    def _connect(self, info: TeacherInfo, owned: bool) -> None:
        try:
            link = TeacherLink(self, info, self.cfg.token, self.cfg.request_timeout_s, self.cfg.depth)
        except (OSError, wire.WireError) as e:
            self.log.warning(f"teacher {info.id} at {info.host}:{info.port} is unreachable ({e}); skipping it")
            self.failed[info.id] = time.monotonic()
            self._release(info.id)
            return
        with self.cv:
            self.links[info.id] = link
            self.stats["teachers_added"] += 1
        link.start()
        self.log.info(f"teacher {info.id} ({info.device}, {info.throughput:.0f} samples/s) assigned; "
                      f"{len(self.links)} teacher(s) now")

    def _renew(self) -> None:
        held = [t for t in self.links if t in self.owned]
        kept = set(self.coord.renew(self.student, held)) if held else set()
        for tid in held:
            link = self.links.get(tid)
            if tid not in kept and link is not None:  # someone else holds it now: give it up
                self.link_failed(link, RuntimeError("lost the lease on this teacher to another student"))

    def _note_coordinator_down(self, e: Exception) -> None:
        self._warn_every("down", f"coordinator unreachable ({type(e).__name__}: {e}); carrying on with the "
                                 f"{len(self.links)} teacher(s) held")

    def _warn_every(self, topic: str, message: str, seconds: float = 10.0) -> None:
        """Log `message`, at most once per `seconds` for the same topic."""
        now = time.monotonic()
        if now - self._warned.get(topic, -seconds) >= seconds:
            self._warned[topic] = now
            self.log.warning(message)

    def _release(self, tid: str) -> None:
        if tid not in self.owned:
            return
        self.owned.discard(tid)
        with contextlib.suppress(Exception):
            self.coord.release(self.student, tid)

    def _sample(self) -> None:
        with self.cv:
            self.timeline.append({"t": round(time.monotonic() - self._t0, 3), "buffer": len(self.ready),
                                  "teachers": len(self.links), "sending": self.sending,
                                  "inflight": sum(len(link.inflight) for link in self.links.values())})

    def take_timeline(self) -> list[dict]:
        with self.cv:
            out, self.timeline = self.timeline, []
            return out

    def close(self) -> None:
        with self.cv:
            self.closed = True
            links = list(self.links.values())
            self.links.clear()
            self.cv.notify_all()
            self.work.notify_all()
        self._stopped.set()
        for link in links:
            link.close()
            self._release(link.info.id)
        self.manager.join(timeout=5)
