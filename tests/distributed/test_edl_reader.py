"""DistilReader and teacher servers over real sockets and a real Redis, in one process (threads).

Each test checks what a student sees: every batch exactly once, in order, with the teacher's
logits, whatever happens to the teachers or to the Coordinator meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import pytest
import torch
from torch import nn

from lowband.data import Batch
from lowband.distill import wire
from lowband.distill.coordinator import Coordinator, TeacherInfo
from lowband.distill.link import TeacherFailed, TeacherLink
from lowband.distill.reader import DistilReader, ReaderConfig, TeacherUnavailable
from lowband.distill.redis_server import EmbeddedRedis
from lowband.distill.serve import Registration
from lowband.distill.teacher import TeacherServer

IN, CLASSES, BS = (8,), 5, 4
log = logging.getLogger("test-reader")
pytestmark = pytest.mark.timeout(120)
WAIT_S = 30.0  # the longest any test here waits for one batch
TIMED_OUT = ("timed out", None)


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as url:
        yield url


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, CLASSES))


class Gated(nn.Module):
    """A model whose forward pass waits until `gate` is set (at most WAIT_S): a teacher holding work."""

    def __init__(self, inner: nn.Module, gate: threading.Event):
        super().__init__()
        self.inner, self.gate = inner, gate

    def forward(self, x):
        self.gate.wait(WAIT_S)
        return self.inner(x)


class Teacher:
    """A teacher server plus its registration, both threads of this process."""

    def __init__(self, url: str, prefix: str, max_rate: float = 0.0, token: str | None = None,
                 gate: threading.Event | None = None):
        net = model() if gate is None else Gated(model(), gate)
        self.server = TeacherServer(net, IN, CLASSES, max_rate=max_rate, token=token).start()
        self.info = TeacherInfo(host="127.0.0.1", port=self.server.port, throughput=max_rate or 1e4)
        self.reg = Registration(Coordinator(url, ttl_s=1.0, prefix=prefix), self.info, 0.1).start()

    def crash(self) -> None:
        """Connections reset, no more heartbeats, no goodbye (what kill -9 looks like from outside)."""
        self.reg._stop.set()
        self.server.close()

    def stop(self) -> None:
        self.reg.stop()
        self.server.close()


@pytest.fixture
def env(redis_url):
    prefix = f"t{time.monotonic_ns()}"
    made = {"teachers": [], "readers": []}

    def teacher(**kw) -> Teacher:
        made["teachers"].append(Teacher(redis_url, prefix, **kw))
        return made["teachers"][-1]

    def reader(**kw) -> DistilReader:
        coord = Coordinator(redis_url, lease_s=1.0, prefix=prefix)
        r = DistilReader(coord, f"student-{len(made['readers'])}", IN, CLASSES, ReaderConfig(**kw), log)
        made["readers"].append(r)
        return r

    yield teacher, reader
    for r in made["readers"]:
        r.close()
    for t in made["teachers"]:
        t.stop()


def batches(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        yield Batch(torch.randn(BS, *IN, generator=g), torch.randint(0, CLASSES, (BS,), generator=g),
                    torch.arange(i * BS, (i + 1) * BS))


def get_within(reader: DistilReader, epoch: int, step: int, seconds: float = WAIT_S):
    """reader.get with a deadline: a batch that never arrives fails the test instead of hanging it."""
    def expire():
        with reader.cv:
            reader.ready.setdefault((epoch, step), TIMED_OUT)
            reader.cv.notify_all()

    timer = threading.Timer(seconds, expire)
    timer.start()
    try:
        got = reader.get(epoch, step)
    finally:
        timer.cancel()
    assert got is not TIMED_OUT, f"batch {step} of epoch {epoch} did not arrive within {seconds:g} s"
    return got


def wait_for(condition, seconds: float, what: str):
    """Poll `condition` until it returns something truthy, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
    return found


def drain(reader: DistilReader, n: int, epoch: int = 1, start: int = 0, reference: nn.Module | None = None) -> list[int]:
    ids = []
    ref = reference or model()
    for step in range(start, n):
        item, logits = get_within(reader, epoch, step)
        assert item.key == (epoch, step)
        torch.testing.assert_close(logits, ref(item.x).detach())  # the teacher's answer to this very batch
        ids += item.ids.tolist()
    return ids


def test_every_batch_once_in_order_with_its_logits(env):
    teacher, reader = env
    teacher(), teacher()
    r = reader(initial=2)
    r.feed(1, batches(60))
    assert drain(r, 60) == list(range(60 * BS))
    assert r.stats["batches_sent"] == 60 and r.stats["resent"] == 0
    assert len(r.links) == 2


@pytest.mark.parametrize("group", [1, 4])
def test_buffer_stays_under_the_upper_threshold(env, group):
    teacher, reader = env
    teacher()
    r = reader(initial=1, ut=6, lt=2, depth=2, group=group)
    r.feed(1, batches(40))
    # the student does not consume: the reader must stop sending once the buffer passes ut
    wait_for(lambda: len(r.ready) > 6, 20, "the buffer never filled past ut")
    time.sleep(0.5)  # time to overshoot, were the reader to go on sending
    # it stops once the buffer exceeds ut; what was in flight then still lands
    assert 6 < len(r.ready) <= 6 + group * 3 and r.stats["batches_sent"] == len(r.ready)
    assert drain(r, 40) == list(range(40 * BS))


def test_killed_teacher_in_flight_batches_are_resent(env):
    teacher, reader = env
    gate, held = threading.Event(), threading.Event()
    # `stuck` takes work and answers none of it; `other` holds its first requests until `stuck` has
    # some, so a fast `other` cannot fill the buffer before `stuck` is connected (a loaded machine)
    stuck, other = teacher(gate=gate), teacher(gate=held)
    r = reader(initial=2, depth=2)
    try:
        r.feed(1, batches(80))

        def in_flight_at_stuck():
            with r.cv:
                link = r.links.get(stuck.info.id)
                return len(link.inflight) if link is not None else 0

        wait_for(in_flight_at_stuck, 20, "the stuck teacher was never sent a request")
        held.set()
        stuck.crash()  # dies holding requests: no timing decides whether it had work
        ids = drain(r, 80)
    finally:
        gate.set()
        held.set()
    assert sorted(ids) == ids == list(range(80 * BS))  # nothing lost, nothing twice
    group = ReaderConfig().group
    assert r.stats["teacher_failures"] == 1 and r.stats["resent"] in (group, 2 * group)  # its 1 or 2 requests
    assert list(r.links) == [other.info.id]


def test_new_teacher_is_scheduled_to_a_starving_student(env):
    teacher, reader = env
    teacher(max_rate=100)  # 25 batches/s: the student starves
    r = reader(max_teachers=4)
    r.feed(1, batches(100))
    ids = drain(r, 10)
    assert len(r.links) == 1
    late = teacher()
    ids += drain(r, 100, start=10)
    assert late.info.id in r.links and r.stats["teachers_added"] == 2
    assert ids == list(range(100 * BS))


def test_no_teacher_waits_saying_so_then_resumes(env, caplog):
    teacher, reader = env
    r = reader()
    r.feed(1, batches(10))
    threading.Timer(2.5, teacher).start()
    with caplog.at_level(logging.WARNING, logger="test-reader"):
        assert drain(r, 10) == list(range(10 * BS))
    assert any("waiting for a teacher" in m for m in caplog.messages)


def test_no_teacher_fails_after_the_configured_wait(env):
    _, reader = env
    r = reader(wait_s=2.2)
    r.feed(1, batches(3))
    t0 = time.monotonic()
    with pytest.raises(TeacherUnavailable, match="teacher_timeout_s = 2.2"):
        r.get(1, 0)
    assert 2.2 <= time.monotonic() - t0 < 10


def test_coordinator_restart_mid_run():
    with EmbeddedRedis() as url:
        server = None
        prefix = f"r{time.monotonic_ns()}"
        t = Teacher(url, prefix, max_rate=2000)
        coord = Coordinator(url, lease_s=1.0, prefix=prefix)
        r = DistilReader(coord, "student-r", IN, CLASSES, ReaderConfig(), log)
        try:
            r.feed(1, batches(200))
            ids = drain(r, 20)
            server = _restart_redis_on(url)
            ids += drain(r, 200, start=20)  # the student carries on with the teacher it holds
            assert ids == list(range(200 * BS))
            wait_for(lambda: t.info.id in {x.id for x in coord.teachers()}, 5,
                     "the teacher did not register again")
        finally:
            r.close()
            t.stop()
            if server is not None:
                server.stop()


def _restart_redis_on(url: str) -> EmbeddedRedis:
    """Kill the Redis at `url` and start an empty one there, with the same password."""
    import redis

    with contextlib.suppress(redis.ConnectionError):
        redis.Redis.from_url(url).shutdown(nosave=True)
    parsed = redis.connection.parse_url(url)
    fresh = EmbeddedRedis(port=parsed["port"], password=parsed.get("password", ""))
    for _ in range(50):
        try:
            fresh.start()
            return fresh
        except Exception:
            time.sleep(0.1)
    raise AssertionError("could not restart Redis")


# ---- the teacher server ------------------------------------------------------------------------------
def _hello(port: int, token: str = "") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    wire.send(s, wire.encode("hello", meta={"token": token}))
    frame, _ = wire.recv(s)
    assert frame.kind == "ready", frame.meta
    return s


def _closed(s: socket.socket) -> bool:
    try:
        while True:
            got = wire.recv(s)
            if got is None:
                return True
            if got[0].kind != "error":
                return False
    except (ConnectionError, OSError):
        return True


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\n\r\n",
    wire.PREFIX.pack(wire.MAGIC, 10**8),
    wire.encode("infer", 1, [torch.zeros(3, 9)]),                  # wrong shape
    wire.encode("infer", 1, [torch.zeros(3, 8, dtype=torch.int64)]),  # not float
    wire.encode("infer", 1, [torch.zeros(5000, 8)]),               # over max_batch
    wire.encode("shutdown", 1),
])
def test_bad_frames_close_that_connection_and_the_server_keeps_serving(garbage):
    server = TeacherServer(model(), IN, CLASSES, max_batch=4096).start()
    try:
        bad = _hello(server.port)
        bad.sendall(garbage)
        assert _closed(bad)
        good = _hello(server.port)
        x = torch.randn(3, 8)
        wire.send(good, wire.encode("infer", 9, [x]))
        frame, _ = wire.recv(good)
        assert frame.id == 9 and torch.allclose(frame.tensors[0], model()(x).detach())
        assert server.rejected == 1
    finally:
        server.close()


def test_oversized_payload_is_rejected_before_it_is_read():
    server = TeacherServer(model(), IN, CLASSES, max_batch=16).start()
    try:
        s = _hello(server.port)
        header = b'{"kind":"infer","id":1,"meta":{},"tensors":[{"dtype":"float32","shape":[1000000,8]}]}'
        s.sendall(wire.PREFIX.pack(wire.MAGIC, len(header)) + header)  # announces 32 MB, sends none
        assert _closed(s)
    finally:
        server.close()


def test_token_is_required_when_set(redis_url):
    server = TeacherServer(model(), IN, CLASSES, token="sesame").start()
    info = TeacherInfo(host="127.0.0.1", port=server.port)

    class R:  # the parts of a reader a link uses
        in_shape, num_classes, limits = IN, CLASSES, wire.Limits()

        def add_bytes(self, **kw):
            pass
    try:
        with pytest.raises(TeacherFailed, match="refused"):
            TeacherLink(R(), info, "wrong", 5.0, 1)
        TeacherLink(R(), info, "sesame", 5.0, 1).close()
    finally:
        server.close()
