"""D-PSGD, RD-PSGD and TopK gossip on real gloo ranks against a single-process simulation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lowband.comm.index_codecs import GapsIndex
from lowband.comm.masks import random_indices
from lowband.comm.topology import neighbours
from lowband.methods.gossip import mask_seed
from tests.distributed.helpers import run_workers

STEPS, LR = 5, 0.1


def ring(world: int) -> torch.Tensor:
    """The ring's mixing matrix, written out: 1/3 for the node and for each of its two neighbours."""
    w = torch.zeros(world, world, dtype=torch.float64)
    for i in range(world):
        for j in (i - 1, i, i + 1):
            w[i, j % world] = 1 / 3
    return w


def trace(tmp_path, world: int, method: str, **options):
    out = tmp_path / f"{method}-{json.dumps(options, sort_keys=True)}".replace(" ", "").replace('"', "")
    out.mkdir()
    code = run_workers("tests.distributed.helpers:gossip_trace", [str(out), str(STEPS), method, json.dumps(options)],
                       world, str(out))
    assert code == 0
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]
    stats = [json.loads((out / f"stats{r}.json").read_text()) for r in range(world)]
    return ranks, stats


def stacked(ranks, key, step):
    return torch.stack([r[key][step] for r in ranks]).double()


def test_dpsgd_matches_x_gets_wx_minus_lr_g(tmp_path):
    world = 4
    ranks, stats = trace(tmp_path, world, "dpsgd")
    w = ring(world)
    x = stacked(ranks, "before", 0)
    for s in range(STEPS):
        torch.testing.assert_close(stacked(ranks, "before", s).float(), x.float())
        x = w @ x - LR * stacked(ranks, "grad", s)  # the simulation, with the gradients the ranks computed
        torch.testing.assert_close(stacked(ranks, "after", s).float(), x.float(), rtol=1e-5, atol=1e-6)
    d = ranks[0]["before"].shape[1]
    for st in stats:  # two neighbours, d float32 values each, every step; no index
        assert st["params"]["sent"] == st["params"]["recv"] == STEPS * 2 * d * 4
        assert st["params"]["wire"] == STEPS * d * 4  # the two neighbours' links carry theirs in parallel
        assert "index" not in st


@pytest.mark.parametrize("index", ["seed", "gaps", "bitmask"])
def test_rdpsgd_mixes_exactly_the_masked_coordinates(tmp_path, index):
    world, p = 4, 0.3
    ranks, stats = trace(tmp_path, world, "rdpsgd", p=p, index=index)
    w = ring(world)
    d = ranks[0]["before"].shape[1]
    index_bytes = 0
    for s in range(STEPS):
        idx = random_indices(d, p, torch.Generator().manual_seed(mask_seed(0, s)), "geometric")
        outside = torch.ones(d, dtype=torch.bool)
        outside[idx] = False
        before, mixed = stacked(ranks, "before", s), stacked(ranks, "mixed", s)
        assert torch.equal(mixed[:, outside], before[:, outside])  # untouched by mixing
        torch.testing.assert_close(mixed[:, idx], (w @ before)[:, idx], rtol=1e-5, atol=1e-6)
        index_bytes += {"seed": 0, "gaps": 8 + GapsIndex().payload_bytes(idx, d), "bitmask": 8 + math.ceil(d / 8)}[index]
    for st in stats:
        sent = sum(len(random_indices(d, p, torch.Generator().manual_seed(mask_seed(0, s)), "geometric"))
                   for s in range(STEPS)) * 4 * 2
        assert st["params"]["sent"] == sent
        assert st.get("index", {"sent": 0})["sent"] == 2 * index_bytes


def test_rdpsgd_with_p_one_is_dpsgd_and_masks_leave_the_global_rng_alone(tmp_path):
    world = 3
    dense, _ = trace(tmp_path, world, "dpsgd")
    full, _ = trace(tmp_path, world, "rdpsgd", p=1.0)
    sparse, _ = trace(tmp_path, world, "rdpsgd", p=0.2, sampler="bernoulli")
    for a, b in zip(dense, full, strict=True):
        assert torch.equal(a["after"], b["after"])
    for a, b in zip(dense, sparse, strict=True):
        assert torch.equal(a["rng"], b["rng"])
        assert not torch.equal(a["after"], b["after"])


def test_topk_with_everything_sent_is_dpsgd(tmp_path):
    world = 4
    dense, _ = trace(tmp_path, world, "dpsgd")
    topk, _ = trace(tmp_path, world, "topk", p=1.0)
    for a, b in zip(dense, topk, strict=True):
        torch.testing.assert_close(b["after"], a["after"], rtol=1e-5, atol=1e-6)


def test_topk_public_copies_agree_across_ranks(tmp_path):
    world = 4
    ranks, stats = trace(tmp_path, world, "topk", p=0.05, index="bitmask")
    for i in range(world):
        for j in neighbours("ring", i, world):  # i's copy of j is what j itself holds as its own copy
            torch.testing.assert_close(ranks[i][f"copy{j}"], ranks[j][f"copy{j}"], rtol=0, atol=0)
    d = ranks[0]["before"].shape[1]
    k = round(0.05 * d)
    for st in stats:
        assert st["params"]["sent"] == STEPS * 2 * k * 4
        assert st["index"]["sent"] == STEPS * 2 * (16 + math.ceil(d / 8))  # (length, k) header + bitmask


def choco_simulation(ranks, p: float, gamma: float) -> dict:
    """CHOCO-SGD (Koloskova et al. 2019) in one process, from the gradients the ranks computed:
    q_i = TopK(x_i - xhat_i); xhat_i += q_i; x_i += gamma * sum_j W_ij (xhat_j - xhat_i); x_i -= lr g_i."""
    world = len(ranks)
    w = ring(world).float()
    x = stacked(ranks, "before", 0).float()
    xhat = x.clone()
    d = x.shape[1]
    k = max(1, round(p * d))
    mixed, after = [], []
    for s in range(STEPS):
        delta = x - xhat
        for i in range(world):
            top = delta[i].abs().argsort(descending=True)[:k]
            xhat[i, top] += delta[i, top]
        x = x + gamma * (w @ xhat - xhat)
        mixed.append(x.clone())
        x = x - LR * stacked(ranks, "grad", s).float()
        after.append(x.clone())
    return {"mixed": mixed, "after": after, "xhat": xhat}


@pytest.mark.parametrize("gamma", [0.4, "auto"])
def test_topk_follows_a_choco_sgd_simulation_with_its_step_size(tmp_path, gamma):
    world, p = 4, 0.1
    ranks, _ = trace(tmp_path, world, "topk", p=p, gamma=gamma)
    step_size = 0.4 if gamma == 0.4 else min(1.0, 5 * p)  # auto: min(1, 5 p) = 0.5
    sim = choco_simulation(ranks, p, step_size)
    for s in range(STEPS):
        torch.testing.assert_close(stacked(ranks, "mixed", s).float(), sim["mixed"][s], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stacked(ranks, "after", s).float(), sim["after"][s], rtol=1e-5, atol=1e-6)
    for i in range(world):  # every rank's public copy of itself is the simulation's xhat
        torch.testing.assert_close(ranks[i][f"copy{i}"], sim["xhat"][i], rtol=1e-5, atol=1e-6)
    other = choco_simulation(ranks, p, 1.0)  # gamma matters in this test
    assert (other["mixed"][-1] - sim["mixed"][-1]).abs().max() > 1e-4


def test_dpsgd_through_fp16_mixes_the_neighbours_rounded_values(tmp_path):
    world = 4
    ranks, stats = trace(tmp_path, world, "dpsgd", codec="fp16")
    w = ring(world)
    own, others = torch.diag(torch.diag(w)), w - torch.diag(torch.diag(w))
    for s in range(STEPS):  # step by step from what the ranks held, so fp16 rounds the same float32 values
        x = torch.stack([r["before"][s] for r in ranks])
        sent = x.half().double()  # what each neighbour's message carried
        expected = own @ x.double() + others @ sent - LR * stacked(ranks, "grad", s)
        torch.testing.assert_close(stacked(ranks, "after", s).float(), expected.float(), rtol=1e-5, atol=1e-6)
    d = ranks[0]["before"].shape[1]
    for st in stats:
        assert st["params"]["sent"] == st["params"]["recv"] == STEPS * 2 * d * 2  # 2 bytes per value


def test_topk_through_int8_keeps_public_copies_equal_and_counts_the_codecs_bytes(tmp_path):
    from lowband.comm.value_codecs import parse_codec

    world = 4
    ranks, stats = trace(tmp_path, world, "topk", p=0.05, index="bitmask", codec="int8")
    for i in range(world):
        for j in neighbours("ring", i, world):
            torch.testing.assert_close(ranks[i][f"copy{j}"], ranks[j][f"copy{j}"], rtol=0, atol=0)
    d = ranks[0]["before"].shape[1]
    k = round(0.05 * d)
    for st in stats:
        assert st["params"]["sent"] == STEPS * 2 * parse_codec("int8").payload_bytes(k)
