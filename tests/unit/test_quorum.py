"""The elastic quorum rule (comm/membership.py's `decide`), a pure function: tested without Redis.

The Redis side of membership (votes, heartbeats, proposals) is tests/contract/test_membership.py.
"""

import pytest

from lowband.comm.membership import Arrival, decide


def arrivals(**spec) -> dict[int, Arrival]:
    """{id: Arrival}; spec values are (version, fingerprint, trained)."""
    return {int(k[1:]): Arrival(v, fp, t) for k, (v, fp, t) in spec.items()}


def test_source_is_the_newest_version_and_others_receive():
    q = decide(5, 0, arrivals(w0=(3, "a", 8), w1=(4, "b", 8), w2=(4, "b", 0), w3=(4, "c", 8)),
               samples=100, batch=1, epochs=3)
    assert q.members[0] == 1  # the highest version, the lowest id among ties
    assert q.contributors == [1]  # w2 trained nothing; w3 holds another θ_global of the same version
    assert sorted(q.receivers) == [0, 3] and q.agree == [1, 2]  # the agreeing members take the outer step
    assert q.version == 4


def test_slices_are_disjoint_equal_and_an_epoch_rolls_over_dropping_less_than_a_step_each():
    """Every member gets the source's steps to its next outer step (4 of batch 4), fewer when the order has
    not that many left for all (3), none when it has not one step for all: the epoch ends there, the rest
    (fewer than a batch a member) dropped and counted, and every other sample trained once."""
    seen, progress = [], Arrival(0, "x", 0, next_stop=4)
    for round_no in range(12):
        q = decide(round_no, 0, {0: progress, 1: Arrival(0, "x", 0), 2: Arrival(0, "x", 0)},
                   samples=95, batch=4, epochs=2)
        if q.epoch_end >= 0:
            assert q.dropped == 95 - 48 - 36  # 11 left: fewer than 3 members x batch 4
            assert sorted(i for a, b in seen for i in range(a, b)) == list(range(95 - q.dropped))  # each once
            seen = []
        if q.finished:
            break
        lengths = {b - a for a, b in q.slices.values()}
        assert len(lengths) == 1 and lengths <= {16, 12}  # the same steps for every member: clocks stay equal
        seen += [tuple(s) for s in q.slices.values()]
        progress = Arrival(0, "x", 0, epoch=q.epoch, cursor=q.next_cursor, next_stop=4)
    assert q.finished and q.epoch == 2


def test_a_slice_ends_at_the_sources_next_outer_step():
    found = {0: Arrival(2, "a", 3, next_stop=5), 1: Arrival(2, "a", 3, next_stop=9), 2: Arrival(1, "b", 0)}
    q = decide(0, 0, found, samples=1000, batch=2, epochs=1)
    assert q.slices == {"0": [0, 10], "1": [10, 20], "2": [20, 30]}  # 5 steps of 2 each: the source's


def test_max_workers_keeps_the_source_then_those_with_a_pseudo_gradient_by_id():
    found = arrivals(w4=(2, "a", 1), w1=(1, "a", 1), w0=(2, "a", 1), w7=(2, "a", 1), w2=(2, "a", 0))
    assert decide(0, 0, found, samples=10, batch=1, epochs=1, max_workers=2).members == [0, 4]
    assert decide(0, 0, found, samples=10, batch=1, epochs=1, max_workers=4).members == [0, 4, 7, 1]


@pytest.mark.parametrize("arrived", [1, 2, 3, 5])
@pytest.mark.parametrize("max_workers", [0, 1, 2, 3, 4])
def test_a_quorum_holds_at_most_max_workers_members_and_slices(arrived, max_workers):
    found = {w: Arrival(1, "a", 2, next_stop=5) for w in range(arrived)}
    q = decide(0, 0, found, samples=100, batch=1, epochs=1, max_workers=max_workers)
    expected = arrived if max_workers == 0 else min(arrived, max_workers)
    assert len(q.members) == len(set(q.members)) == expected
    assert set(q.contributors) <= set(q.members) and len(q.slices) == expected


def test_epoch_loss_accumulates_from_the_agreeing_members_and_resets_at_the_end():
    """The steps each agreeing member trained since its last round and their loss; a receiver's are not the
    epoch's (it trained from another θ_global)."""
    src = Arrival(1, "a", 4, fresh=4, loss_sum=8.0, epoch=0, cursor=100, epoch_loss=10.0, epoch_steps=6)
    q = decide(3, 0, {0: src, 1: Arrival(1, "a", 4, fresh=4, loss_sum=4.0), 2: Arrival(0, "z", 9, fresh=9, loss_sum=90.0)},
               samples=100, batch=5, epochs=3)
    assert q.epoch_end == 1 and q.ended_loss == pytest.approx((10 + 8 + 4) / (6 + 4 + 4))
    assert (q.epoch_loss, q.epoch_steps, q.epoch, q.dropped) == (0.0, 0, 1, 0)
