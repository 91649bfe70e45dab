"""Inter-site bytes, counted by a single-process Communicator over a fake world of 4 ranks in 2 sites.

torch.distributed's calls are replaced by no-ops: what is checked is the counting, against sums
worked out by hand from the byte model (lowband.comm.communicator) with a 400-byte tensor.
"""

from __future__ import annotations

import time

import pytest
import torch

from lowband.comm import Communicator
from lowband.comm import communicator as C
from lowband.run.reporter import EpochReporter, RankFigures, tag_bytes

SITES = [0, 0, 1, 1]  # ring 0 -> 1 -> 2 -> 3 -> 0: edges 1->2 and 3->0 cross
T = 400  # bytes: 100 float32


class FakeDist:
    """Enough of torch.distributed for the communicator's counting: every call moves nothing."""

    P2POp = staticmethod(lambda *a: a)
    isend = irecv = None

    def __getattr__(self, name):
        return lambda *a, **k: []


@pytest.fixture(autouse=True)
def fake_dist(monkeypatch):
    monkeypatch.setattr(C, "dist", FakeDist())


def world(site_of=SITES) -> list[Communicator]:
    return [Communicator(r, 4, group=object(), site_of=site_of) for r in range(4)]


def inter(comms, tag: str) -> list[float]:
    return [c.ledger.stats[tag].inter for c in comms]


def tensor() -> torch.Tensor:
    return torch.zeros(100)


def test_ring_collectives_count_the_two_crossing_edges():
    comms = world()
    for c in comms:
        c.allreduce(tensor(), "grad")
        c.all_gather(tensor(), "params")
    assert inter(comms, "grad") == [0, 600, 0, 600]  # 2(K-1)/K * 400 on ranks whose next rank is in the other site
    assert inter(comms, "params") == [0, 1200, 0, 1200]  # (K-1) * 400
    assert [c.ledger.stats["grad"].sent for c in comms] == [600] * 4


def test_broadcast_chain_crosses_where_its_edges_do():
    comms = world()
    for c in comms:
        c.broadcast(tensor(), 0, "init")  # 0 -> 1 -> 2 -> 3: only 1 -> 2 crosses
        c.broadcast(tensor(), 2, "ckpt")  # 2 -> 3 -> 0 -> 1: only 3 -> 0 crosses
    assert inter(comms, "init") == [0, T, 0, 0]
    assert inter(comms, "ckpt") == [0, 0, 0, T]


def test_point_to_point_is_exact_by_the_peers_site():
    comms = world()
    comms[0].send(tensor(), 1, "a")
    comms[1].send(tensor(), 2, "a")
    comms[0].exchange({1: torch.zeros(25), 3: torch.zeros(50)}, {}, "x")
    assert inter(comms, "a") == [0, T, 0, 0]
    assert comms[0].ledger.stats["x"].inter == 200 and comms[0].ledger.stats["x"].sent == 300


def test_a_split_inside_one_site_counts_no_inter_bytes():
    comms = world()
    inside = [c.split([[0, 1], [2, 3]]) for c in comms]
    across = [c.split([[0, 2], [1, 3]]) for c in comms]
    for c in inside:
        c.allreduce(tensor(), "grad")
    for c in across:
        c.allreduce(tensor(), "avg")
    assert inter(comms, "grad") == [0, 0, 0, 0]  # shared counters
    assert inter(comms, "avg") == [T] * 4  # a ring of 2 ranks in 2 sites: both edges cross, 2(2-1)/2 * 400


def test_without_a_site_map_every_byte_crosses():
    comms = world(None)
    for c in comms:
        c.allreduce(tensor(), "grad")
    assert inter(comms, "grad") == [600] * 4


def test_records_carry_inter_bytes_per_tag_and_per_worker():
    comms = world()
    for c in comms:
        c.allreduce(tensor(), "grad")
    ranks = [RankFigures(loss=1.0, samples=1, bytes=tag_bytes(c)) for c in comms]
    rec = EpochReporter.record(EpochReporter.__new__(EpochReporter), 1, ranks, None)
    assert rec.bytes_inter_per_worker == 300 and rec.bytes["grad"]["inter"] == 300
    assert rec.bytes_total["grad"]["inter"] == 1200


def test_checkpoint_writes_cross_sites_when_the_ranks_span_several(tmp_path):
    from lowband.comm.store import CheckpointStore

    state = {"w": torch.zeros(10)}
    for site_of, crosses in (([0, 0, 1, 1], True), ([0, 0, 0, 0], False)):
        comm = world(site_of)[0]
        CheckpointStore(str(tmp_path / str(crosses)), comm).publish(0, 1, state)
        s = comm.ledger.stats["ckpt"]
        assert s.sent > 40 and s.inter == (s.sent if crosses else 0)


def test_the_modelled_link_delays_by_the_class_of_link_crossed():
    from lowband.net.links import UNLIMITED, LinkModel, LinkSpec

    model = LinkModel(LinkSpec(8e6), LinkSpec(8e3))  # 1 MB/s between sites, 1 kB/s inside
    now = time.monotonic()
    assert model.reserve("a", 1000) - now == pytest.approx(0.001, abs=0.05)
    assert model.reserve("a", 1000, inter=False) - now == pytest.approx(1.0, abs=0.05)  # its own queue
    assert LinkModel(LinkSpec(8e6)).reserve("a", 1000, inter=False) == 0.0  # intra unlimited: no wait
    comms = world()
    for c in comms:
        c.ledger.link = LinkModel(LinkSpec(8e9), UNLIMITED)
    comms[0].send(tensor(), 1, "a")  # inside site 0: unlimited, no queue
    comms[1].send(tensor(), 2, "a")  # across: the inter-site queue to rank 2
    comms[1].allreduce(tensor(), "grad")  # next rank 2: the inter-site ring link
    comms[0].exchange({1: tensor(), 3: tensor()}, {}, "x")  # only the peer in the other site queues
    assert dict(comms[0].link.free_at).keys() == {3}
    assert dict(comms[1].link.free_at).keys() == {2, "ring"}


def test_netns_mode_takes_sites_but_refuses_an_intra_latency(monkeypatch):
    from lowband import config
    from lowband.errors import UsageError
    from lowband.net import links
    from lowband.training.runconfig import method_configs
    from lowband.training.spec import resolve

    cfg = config.from_dict({"link": {"mode": "netns", "sites": 2}, "train": {"workers": 4}}, method_configs())
    assert resolve(cfg, 4).sites == [0, 0, 1, 1]
    monkeypatch.setattr(links.os, "geteuid", lambda: 0)
    with pytest.raises(UsageError, match=r"^link.intra: --link-mode netns .* cannot add latency"):
        links.check_netns_possible(links.parse_link("1gbit,1ms", "link.intra"), "link.intra")


def test_checkpoint_writes_wait_on_the_link_they_cross(tmp_path):
    from lowband.comm.store import CheckpointStore
    from lowband.net.links import UNLIMITED, LinkModel, LinkSpec

    for site_of, queued in (([0, 0, 1, 1], {"store"}), ([0, 0, 0, 0], set())):
        comm = world(site_of)[0]
        comm.ledger.link = LinkModel(LinkSpec(8e9), UNLIMITED)
        CheckpointStore(str(tmp_path / str(len(queued))), comm).publish(0, 1, {"w": torch.zeros(10)})
        assert dict(comm.link.free_at).keys() == queued


def test_hierarchical_allreduce_sends_across_sites_from_the_leaders_only():
    from lowband.comm.hierarchy import Hierarchy

    comms = world()
    for c in comms:
        Hierarchy(c).allreduce(tensor(), "grad")
    assert inter(comms, "grad") == [400, 0, 400, 0]  # two leaders' ring: 2(S-1)/S * 400 each
    # leaders: the ring plus the site broadcast; the others: their tree-reduce send into the leader
    assert [c.ledger.stats["grad"].sent for c in comms] == [800, 400, 800, 400]
    assert [c.ledger.stats["grad"].recv for c in comms] == [800, 400, 800, 400]


def test_hierarchical_allreduce_without_a_site_map_is_the_flat_ring():
    from lowband.comm.hierarchy import Hierarchy

    comms = world(site_of=None)
    for c in comms:
        Hierarchy(c).allreduce(tensor(), "grad")
    assert inter(comms, "grad") == [600] * 4 and [c.ledger.stats["grad"].sent for c in comms] == [600] * 4
