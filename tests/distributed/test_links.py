"""Slow links across real processes: modelled in the communicator, and real tc-shaped namespaces."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lowband.comm.links import LinkSpec, leftover_namespaces
from tests.distributed.helpers import run_workers


def run(tmp_path, world, op, nbytes, rate=0.0, netns=None):
    code = run_workers("tests.distributed.helpers:timed_transfer", [str(tmp_path), op, str(nbytes), str(rate)],
                       world, str(tmp_path), netns=netns)
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
    assert not [line for line in os.popen("ip -o link show").read().splitlines() if "lbbr" in line or "lbv" in line]
