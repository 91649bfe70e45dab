"""The elastic quorum rule (comm/membership.py's `decide`), a pure function: tested without Redis.

The Redis side of membership (votes, heartbeats, proposals) is tests/contract/test_membership.py; what a
round hands out (an elastic job's data plan) is tests/unit/test_data_plan.py.
"""

import pytest

from lowband.comm.membership import Arrival, decide


def arrivals(**spec) -> dict[int, Arrival]:
    """{id: Arrival}; spec values are (version, fingerprint, trained)."""
    return {int(k[1:]): Arrival(v, fp, t) for k, (v, fp, t) in spec.items()}


def test_source_is_the_newest_version_and_others_receive():
    q = decide(5, 0, arrivals(w0=(3, "a", 8), w1=(4, "b", 8), w2=(4, "b", 0), w3=(4, "c", 8)))
    assert q.members[0] == 1  # the highest version, the lowest id among ties
    assert q.contributors == [1]  # w2 trained nothing; w3 holds another θ_global of the same version
    assert sorted(q.receivers) == [0, 3] and q.agree == [1, 2]  # the agreeing members take the outer step
    assert q.version == 4


def test_max_workers_keeps_the_source_then_those_with_a_pseudo_gradient_by_id():
    found = arrivals(w4=(2, "a", 1), w1=(1, "a", 1), w0=(2, "a", 1), w7=(2, "a", 1), w2=(2, "a", 0))
    assert decide(0, 0, found, max_workers=2).members == [0, 4]
    assert decide(0, 0, found, max_workers=4).members == [0, 4, 7, 1]


@pytest.mark.parametrize("arrived", [1, 2, 3, 5])
@pytest.mark.parametrize("max_workers", [0, 1, 2, 3, 4])
def test_a_quorum_holds_at_most_max_workers_members_and_slices(arrived, max_workers):
    found = {w: Arrival(1, "a", 2, {"w": w}) for w in range(arrived)}
    q = decide(0, 0, found, max_workers=max_workers, plan=lambda q, brought: {"brought": sorted(brought)})
    expected = arrived if max_workers == 0 else min(arrived, max_workers)
    assert len(q.members) == len(set(q.members)) == expected
    assert set(q.contributors) <= set(q.members)
    assert q.plan == {"brought": sorted(q.members)}  # the plan hears from the members, and only them


def test_without_a_plan_a_decision_hands_out_nothing():
    assert decide(0, 0, arrivals(w0=(0, "a", 1))).plan == {}



