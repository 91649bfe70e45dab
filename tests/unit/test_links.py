"""Link specs and the modelled link's queues."""

import time

import pytest

from lowband.errors import UsageError
from lowband.net.links import LinkModel, LinkSpec, parse_link


@pytest.mark.parametrize("text, rate, latency", [("10mbit,20ms", 10e6, 0.02), ("100mbit", 100e6, 0.0),
                                                 ("1.5gbit,250us", 1.5e9, 250e-6), ("800kbit,1s", 800e3, 1.0)])
def test_parse(text, rate, latency):
    spec = parse_link(text)
    assert spec.rate_bps == pytest.approx(rate) and spec.latency_s == pytest.approx(latency)


def test_unlimited():
    assert not parse_link("").limited and not parse_link("unlimited").limited
    assert parse_link("unlimited").describe() == "unlimited"


@pytest.mark.parametrize("text", ["10mbps", "fast", "10mbit,soon", "0mbit", "10 Mb"])
def test_bad_rates_say_what_is_expected(text):
    with pytest.raises(UsageError, match="RATE\\[,LATENCY\\]"):
        parse_link(text)


def test_a_link_drains_in_order_and_links_are_independent():
    model = LinkModel(LinkSpec(8e6, 0.01))  # 1 MB/s
    t0 = time.monotonic()
    first = model.reserve("a", 100_000)
    second = model.reserve("a", 100_000)
    other = model.reserve("b", 100_000)
    assert first - t0 == pytest.approx(0.11, abs=0.01)
    assert second - t0 == pytest.approx(0.21, abs=0.01)  # queued behind the first
    assert other - t0 == pytest.approx(0.11, abs=0.01)  # another link is not


def test_netns_mode_explains_what_it_needs(monkeypatch):
    from lowband.net import links

    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    with pytest.raises(UsageError, match="needs root"):
        links.check_netns_possible(LinkSpec(10e6))
    monkeypatch.setattr(links.os, "geteuid", lambda: 0)
    monkeypatch.setattr(links.shutil, "which", lambda tool: None if tool == "tc" else "/sbin/ip")
    with pytest.raises(UsageError, match="needs tc"):
        links.check_netns_possible(LinkSpec(10e6))
    monkeypatch.setattr(links.shutil, "which", lambda tool: "/sbin/" + tool)
    with pytest.raises(UsageError, match="cannot add latency"):
        links.check_netns_possible(LinkSpec(10e6, 0.02))
