"""Slow links across real processes: modelled in the communicator, and real tc-shaped namespaces."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lowband.net.links import LinkSpec, leftover_namespaces
from tests.distributed.helpers import run_workers


def run(tmp_path, world, op, nbytes, rate=0.0, netns=None, **kw):
    code = run_workers("tests.distributed.helpers:timed_transfer", [str(tmp_path), op, str(nbytes), str(rate)],
                       world, str(tmp_path), netns=netns, **kw)
    assert code == 0
    return [json.loads((tmp_path / f"time{r}.json").read_text()) for r in range(world)]


def test_modelled_link_send_takes_size_over_rate(tmp_path):
    nbytes, rate = 1_000_000, 10e6  # 8 Mbit at 10 Mbit/s: 0.8 s
    times = run(tmp_path, 2, "send", nbytes, rate)
    assert times[0]["seconds"] == pytest.approx(nbytes * 8 / rate, rel=0.10)


def test_modelled_link_allreduce_follows_the_ring_model(tmp_path):
    world, nbytes, rate = 3, 600_000, 8e6  # each rank sends 2(K-1)/K * S = 800 kB: 0.8 s
    times = run(tmp_path, world, "allreduce", nbytes, rate)
    for t in times:
        assert t["sent"] == pytest.approx(2 * (world - 1) / world * nbytes)
        assert t["seconds"] == pytest.approx(t["sent"] * 8 / rate, rel=0.10)


netns_ok = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
needs_netns = pytest.mark.skipif(not netns_ok, reason="real shaped links need root and iproute2 (ip, tc)")


@needs_netns
def test_real_shaped_link_allreduce_takes_the_ring_models_time_and_leaves_nothing(tmp_path):
    nbytes, rate = 10_000_000, 20e6  # K = 2: each rank sends S = 10 MB: 4 s at 20 Mbit/s
    times = run(tmp_path, 2, "allreduce", nbytes, netns=LinkSpec(rate))
    for t in times:
        assert t["seconds"] == pytest.approx(t["sent"] * 8 / rate, rel=0.25)
    assert leftover_namespaces() == []


@needs_netns
def test_real_links_are_removed_after_a_worker_is_killed(tmp_path):
    code = run_workers("tests.distributed.helpers:die_after_joining", [str(tmp_path)], 3, str(tmp_path),
                       netns=LinkSpec(50e6))
    assert code == 128 + 9
    assert leftover_namespaces() == []
    assert _our_links() == []


def _our_links() -> list[str]:
    return [line for line in os.popen("ip -o link show").read().splitlines()
            if any(f" {prefix}" in line for prefix in ("lbbr", "lbv", "lbs", "lbu", "lbc"))]


@needs_netns
def test_real_sites_shape_only_the_uplink_between_sites(tmp_path):
    nbytes, rate = 2_500_000, 20e6  # 20 Mbit across sites: 1 s; inside a site: the kernel's speed
    # timed at the receiver: a sender is done once its socket buffer has taken the bytes
    inside = run(tmp_path, 4, "send:1", nbytes, netns=LinkSpec(rate), sites=[0, 0, 1, 1])[1]["seconds"]
    across = run(tmp_path, 4, "send:2", nbytes, netns=LinkSpec(rate), sites=[0, 0, 1, 1])[2]["seconds"]
    assert across == pytest.approx(nbytes * 8 / rate, rel=0.25)
    assert inside < across / 5
    assert leftover_namespaces() == [] and _our_links() == []


@needs_netns
def test_real_sites_layout_bridges_and_shapes_what_it_says():
    from lowband.net.links import NetnsLinks

    with NetnsLinks(3, LinkSpec(20e6), site_of=[0, 0, 1], intra=LinkSpec(1e9)) as net:
        qdiscs = os.popen("tc qdisc show").read()
        shaped = {line.split()[4] for line in qdiscs.splitlines() if "tbf" in line and net.id in line}
        assert shaped == {f"lbu{net.id}s0", f"lbc{net.id}s0", f"lbv{net.id}r0", f"lbv{net.id}r1", f"lbv{net.id}r2"}
        assert "rate 20Mbit" in os.popen(f"tc qdisc show dev lbu{net.id}s0").read()
        assert "rate 1Gbit" in os.popen(f"tc qdisc show dev lbv{net.id}r0").read()
        assert "rate 20Mbit" in os.popen(f"tc qdisc show dev lbv{net.id}r2").read()  # alone: hangs off the core
        links = os.popen("ip -o link show").read()
        assert f"lbv{net.id}r0@" in links and f"master lbs{net.id}s0" in links and f"lbs{net.id}s1" not in links
    assert leftover_namespaces() == [] and _our_links() == []
