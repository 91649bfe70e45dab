"""The byte ledger's entry points (comm/ledger.py): what a mover hands over, and the one place that
reserves the modelled link."""

from __future__ import annotations

import pathlib
import re
import threading
import time

import pytest

from lowband.comm.ledger import Ledger, Tally, Traffic
from lowband.net.links import LinkModel, LinkSpec

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "lowband"


@pytest.fixture
def waited(monkeypatch) -> list[float]:
    """The times a modelled link held the caller until (nothing sleeps)."""
    held: list[float] = []
    monkeypatch.setattr(LinkModel, "wait_until", staticmethod(held.append))
    return held


def test_only_the_ledger_reserves_the_modelled_link():
    pattern = re.compile(r"\.reserve\(")
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == ["comm/ledger.py"]


def test_a_movers_traffic_is_counted_with_its_own_inter_site_share_or_by_crossing(waited):
    ledger = Ledger(LinkModel(LinkSpec(8000.0)))
    ledger.outside("served", Traffic(100, 40, inter=30), peer=None)  # a server: its askers' ledgers hold the link
    ledger.outside("soft-labels", Traffic(100, 40), crosses=True, peer="out")
    ledger.outside("control", Traffic(7, 9), crosses=False, peer=None)
    stats = {tag: (s.sent, s.recv, s.inter, s.calls) for tag, s in ledger.stats.items()}
    assert stats == {"served": (100, 40, 30, 1), "soft-labels": (100, 40, 100, 1), "control": (7, 9, 0, 1)}
    assert len(waited) == 1  # only the traffic with a peer link waited


def test_a_request_and_its_answer_on_one_link_wait_for_both_and_one_latency(waited):
    link = LinkModel(LinkSpec(8000.0, latency_s=0.5))  # 1000 bytes/s
    ledger, t0 = Ledger(link), time.monotonic()
    ledger.outside("predictions", Traffic(100, 300), crosses=True, peer="predictions", reply_peer="predictions")
    assert len(waited) == 1 and waited[0] - t0 == pytest.approx(0.4 + 0.5, abs=0.01)
    assert ledger.stats["predictions"].sent == 100 and ledger.stats["predictions"].inter == 100


def test_a_posted_call_reserves_every_link_it_takes_and_says_when_all_arrived(waited):
    link = LinkModel(LinkSpec(8000.0))
    ledger = Ledger(link)
    ready = ledger.count("grad", 400, 400, wire=300, links=[(1, 100, True), (2, 300, True)])
    assert ready == link.free_at[2] > link.free_at[1] and waited == []  # the caller waits when its call completes
    assert Ledger().count("grad", 400, 400, links=[(1, 100, True)]) == 0.0  # no modelled link: nothing to wait for


def test_a_tally_loses_no_byte_to_threads_adding_while_the_loop_takes():
    """Eight threads add 1,000 times each while the loop takes repeatedly: the takes sum to every add."""
    tally, taken, stop = Tally(), [], threading.Event()

    def add(i):
        for _ in range(1000):
            tally.add(sent=1, recv=2, inter=i % 2)

    def take():
        while not stop.is_set():
            taken.append(tally.take())

    taker = threading.Thread(target=take)
    taker.start()
    adders = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in adders:
        t.start()
    for t in adders:
        t.join()
    stop.set()
    taker.join()
    taken.append(tally.take())
    assert sum(t.sent for t in taken) == 8000 and sum(t.recv for t in taken) == 16000
    assert sum(t.inter for t in taken) == 4000
    assert tally.take(with_inter=False) == Traffic(0.0, 0.0, None)
