"""DiLoCo across real processes against a single-process reference of the outer loop, and the
bytes of every codec against their analytic count."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
import torch

from lowband.comm.value_codecs import parse_codec
from lowband.run.metrics import read_metrics
from tests.conftest import cli, small
from tests.distributed.helpers import initial_model, run_workers

P = sum(p.numel() for p in initial_model().parameters())


def trace(tmp_path, world: int, steps: int, **options) -> list[dict]:
    assert run_workers("tests.distributed.helpers:diloco_trace", [str(tmp_path), str(steps), json.dumps(options)],
                       world, str(tmp_path)) == 0
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


def reference_outer(ranks, steps, tau, lr, momentum, nesterov=True) -> np.ndarray:
    """θ_global after each sync, recomputed in NumPy from every rank's parameters before the sync
    (Nesterov's momentum, or heavy ball: θ <- θ - lr·buf)."""
    anchor = initial_model_vector()
    buf, out = np.zeros_like(anchor), {}
    for s in range(steps):
        if (s + 1) % tau:
            continue
        delta = anchor - np.mean([r["pre"][s].double().numpy() for r in ranks], axis=0)
        buf = momentum * buf + delta if s + 1 > tau or momentum == 0 else delta  # torch's first step: buf = grad
        step = (delta + momentum * buf if nesterov else buf) if momentum else delta
        anchor = anchor - lr * step
        out[s] = anchor
    return out


def initial_model_vector() -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in initial_model().parameters()]).double().numpy()


def test_outer_lr_one_without_momentum_is_local_sgd(tmp_path):
    world, steps, tau = 3, 7, 3
    ranks = trace(tmp_path, world, steps, tau=tau, outer_lr=1.0, outer_momentum=0.0)
    for s in range(steps):
        pre = torch.stack([r["pre"][s] for r in ranks])
        post = torch.stack([r["post"][s] for r in ranks])
        if (s + 1) % tau == 0:
            for r in range(world):
                assert torch.equal(post[r], post[0])
            torch.testing.assert_close(post[0], pre.mean(0), rtol=1e-5, atol=1e-6)  # model averaging
        else:
            assert torch.equal(post, pre)


@pytest.mark.parametrize("momentum, nesterov", [(0.0, True), (0.9, True), (0.9, False)])
def test_outer_nesterov_step_matches_a_numpy_reference(tmp_path, momentum, nesterov):
    """Nesterov's outer momentum, and heavy ball with outer_nesterov=false (which must differ)."""
    world, steps, tau, lr = 2, 9, 3, 0.7
    ranks = trace(tmp_path, world, steps, tau=tau, outer_lr=lr, outer_momentum=momentum, outer_nesterov=nesterov)
    expected = reference_outer(ranks, steps, tau, lr, momentum, nesterov)
    if momentum:
        other = reference_outer(ranks, steps, tau, lr, momentum, not nesterov)
        assert np.abs(other[steps - 1] - expected[steps - 1]).max() > 1e-4  # the flag changes the step
    for s, anchor in expected.items():
        for r in ranks:
            np.testing.assert_allclose(r["post"][s].double().numpy(), anchor, rtol=1e-4, atol=1e-5)
    # the global model is θ_global: no steps after the last sync (9 = 3 * 3), so no extra sync
    assert ranks[0]["stats_final"]["params"]["calls"] == ranks[0]["stats"]["params"]["calls"]
    torch.testing.assert_close(ranks[0]["final"], ranks[0]["post"][steps - 1])


def test_fp32_bytes_are_one_allreduce_per_sync_and_the_final_sync(tmp_path):
    world, steps, tau = 4, 10, 4
    ranks = trace(tmp_path, world, steps, tau=tau)
    per_sync = 2 * (world - 1) / world * P * 4
    assert ranks[0]["stats"]["params"]["sent"] == pytest.approx(2 * per_sync)
    assert ranks[0]["stats_final"]["params"]["sent"] == pytest.approx(3 * per_sync)  # steps 9-10 go in at the end
    finals = [r["final"] for r in ranks]
    assert all(torch.equal(f, finals[0]) for f in finals)


def segment_bytes(codec, world: int, rank: int) -> float:
    """Per rank and sync: segment j to each peer j (reduce-scatter), then the owned mean to K-1 peers."""
    bounds = [P * i // world for i in range(world + 1)]
    sizes = [b - a for a, b in pairwise(bounds)]
    return sum(codec.payload_bytes(sizes[j]) for j in range(world) if j != rank) + \
        (world - 1) * codec.payload_bytes(sizes[rank])


@pytest.mark.parametrize("spec", ["int8", "int4:stochastic", "topk:0.05+int2", "bf16"])
def test_codecs_keep_ranks_equal_and_send_their_exact_size(tmp_path, spec):
    world, steps, tau = 3, 8, 4
    ranks = trace(tmp_path, world, steps, tau=tau, codec=spec)
    codec = parse_codec(spec)
    for rank, r in enumerate(ranks):
        per_sync = (world - 1) * codec.payload_bytes(P) if codec.sparse else segment_bytes(codec, world, rank)
        assert r["stats"]["params"]["sent"] == pytest.approx(2 * per_sync)
        assert torch.equal(r["post"][tau - 1], ranks[0]["post"][tau - 1])  # same θ_global everywhere
        assert torch.equal(r["post"][steps - 1], ranks[0]["post"][steps - 1])
    assert per_sync < 2 * (world - 1) / world * P * 4 / 1.9  # smaller than fp32 by about 2x or more
    residual = ranks[0]["state"]["fragments"][0]["feedback"]["residual"]
    assert residual.abs().sum() > 0  # error feedback kept what was dropped


def test_streaming_fragments_sync_in_rotation(tmp_path):
    world, steps, tau, parts = 2, 8, 4, 2
    ranks = trace(tmp_path, world, steps, tau=tau, fragments=parts, outer_lr=1.0, outer_momentum=0.0)
    sizes = [s["anchor"].numel() for s in ranks[0]["state"]["fragments"]]
    assert sum(sizes) == P and min(sizes) > 0
    first = sizes[0]
    for s in range(steps):
        pre = torch.stack([r["pre"][s] for r in ranks])
        post = torch.stack([r["post"][s] for r in ranks])
        synced = {0: (s + 1) % tau == 2, 1: (s + 1) % tau == 0}
        for frag, sl in ((0, slice(0, first)), (1, slice(first, P))):
            if synced[frag]:
                torch.testing.assert_close(post[0, sl], pre[:, sl].mean(0), rtol=1e-5, atol=1e-6)
                assert torch.equal(post[1, sl], post[0, sl])
            else:
                assert torch.equal(post[:, sl], pre[:, sl])
    per_rank = sum(2 * (world - 1) / world * n * 4 * 2 for n in sizes)  # each fragment twice in 8 steps
    assert ranks[0]["stats"]["params"]["sent"] == pytest.approx(per_rank)


def test_overlap_merges_the_result_later_with_mix(tmp_path):
    world, steps, tau = 2, 6, 4
    ranks = trace(tmp_path, world, steps, tau=tau, overlap=2, mix=0.5, outer_lr=1.0, outer_momentum=0.0)
    sync = tau - 1  # sent after step 4 (index 3), merged after step 6 (index 5)
    anchor = torch.stack([r["pre"][sync] for r in ranks]).mean(0)
    assert all(torch.equal(r["post"][sync], r["pre"][sync]) for r in ranks)  # nothing merged at the send
    for r in ranks:
        torch.testing.assert_close(r["post"][5], 0.5 * anchor + 0.5 * r["pre"][5], rtol=1e-5, atol=1e-6)


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    """θ_global, the outer momentum and the error-feedback residual come back from the checkpoint:
    one epoch + --resume to two ends with the same model as two epochs in one go."""
    from safetensors.torch import load_file

    def train(run_dir, *extra):
        p = cli("train", "--method", "diloco", "--workers", "2", "--run-dir", str(run_dir), *extra,
                *small(tmp_path, "--set", "method.tau=5", "--set", "method.codec=topk:0.1+int4",
                      "--set", "optim.schedule='constant'"))
        assert p.returncode == 0, p.stderr

    train(tmp_path / "straight", "--epochs", "2")
    train(tmp_path / "resumed", "--epochs", "1")
    p = cli("train", "--resume", str(tmp_path / "resumed"), "--epochs", "2")
    assert p.returncode == 0, p.stderr
    records = read_metrics(str(tmp_path / "resumed"))
    assert [r.epoch for r in records] == [1, 2] and math.isfinite(records[-1].train_loss)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("straight", "resumed"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


# Bad settings of diloco: tests/unit/test_bad_inputs.py checks them in-process ("diloco-*").


def test_local_sgd_with_a_codec_sends_compressed_changes(tmp_path):
    """local_sgd:codec=int8 averages the same way, in the int8 reduce-scatter + all-gather's bytes."""
    p = cli("train", "--method", "local_sgd", "--workers", "2", "--epochs", "1", "--run-dir", str(tmp_path / "l"),
            *small(tmp_path, "--set", "method.tau=4", "--set", "method.codec=int8"))
    assert p.returncode == 0, p.stderr
    record = read_metrics(str(tmp_path / "l"))[-1]
    state = sum(t.numel() for t in initial_model().state_dict().values() if t.is_floating_point())
    codec, rounds = parse_codec("int8"), 13 // 4  # 13 steps per epoch (see test_local_methods)
    per_round = codec.payload_bytes(state // 2) + codec.payload_bytes(state - state // 2)  # K = 2: each way once
    # the final global model: the step since the last average (13 = 3 x 4 + 1), averaged once more the same way
    assert record.bytes["params"]["sent"] == pytest.approx((rounds + 1) * per_round)


def test_replicas_allreduce_inside_and_only_their_first_ranks_step_outside(tmp_path):
    world, steps, tau = 4, 8, 4
    ranks = trace(tmp_path, world, steps, tau=tau, group_size=2, outer_lr=1.0, outer_momentum=0.0)
    for s in range(steps):
        post = [r["post"][s] for r in ranks]
        assert torch.equal(post[0], post[1]) and torch.equal(post[2], post[3])  # one model per replica
        if (s + 1) % tau == 0:
            assert torch.equal(post[0], post[2])
            torch.testing.assert_close(post[0], torch.stack([r["pre"][s] for r in ranks]).mean(0), rtol=1e-5, atol=1e-6)
        else:
            assert not torch.equal(post[0], post[2])
    stats = [r["stats"] for r in ranks]
    per_sync = 2 * (2 - 1) / 2 * P * 4  # an fp32 allreduce between the 2 replicas' first ranks
    assert [s.get("params", {}).get("sent", 0) for s in stats] == pytest.approx([2 * per_sync, 0, 2 * per_sync, 0])
    assert stats[1]["params-group"]["recv"] == 2 * P * 4 and stats[0]["params-group"]["sent"] == 2 * P * 4
    assert stats[0]["grad"]["calls"] == steps  # the replica's gradient allreduce, every step


def test_group_size_must_divide_the_workers(tmp_path):
    p = cli("train", "--method", "diloco", "--workers", "2", "--out", str(tmp_path / "runs"),
            *small(tmp_path, "--set", "method.group_size=3"))
    assert p.returncode == 2 and "method.group_size=3" in p.stderr and p.stderr.strip().count("\n") == 0
