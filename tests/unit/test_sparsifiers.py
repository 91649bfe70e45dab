"""Gossip sparsifiers in one process: what each sends for a step, its exact wire bytes, how it applies."""

from __future__ import annotations

import math

import pytest
import torch

from lowband.comm.index_codecs import GapsIndex
from lowband.comm.masks import random_indices
from lowband.methods.sparsifiers import (
    Dense,
    Incoming,
    Mixing,
    RandomK,
    Timers,
    TopK,
    mask_seed,
)

D = 50
MIXING = Mixing(rank=1, peers=[0, 2], w_self=0.5, w_peer={0: 0.2, 2: 0.3})


def bound(sparsifier, seed: int = 0):
    x = torch.randn(D, generator=torch.Generator().manual_seed(seed))
    sparsifier.bind(x, MIXING, Timers())
    return sparsifier, x


def neighbour_values(n: int) -> dict[int, torch.Tensor]:
    return {j: torch.full((n,), float(j + 1)) for j in MIXING.peers}


def test_dense_sends_everything_and_mixes_with_the_weights():
    dense, x = bound(Dense())
    before = x.clone()
    msg = dense.message(0)
    assert torch.equal(msg.values, before) and msg.index is None
    assert msg.bytes_by_tag() == {"params": D * 4}  # values only, no header
    got = neighbour_values(D)
    dense.apply(msg, {j: Incoming(v) for j, v in got.items()})
    torch.testing.assert_close(x, 0.5 * before + 0.2 * got[0] + 0.3 * got[2])


@pytest.mark.parametrize("index", ["seed", "gaps", "bitmask"])
def test_random_k_sends_the_shared_mask_and_mixes_only_it(index):
    rk, x = bound(RandomK(0.3, index, "geometric", seed=7))
    before = x.clone()
    msg = rk.message(4)
    idx = random_indices(D, 0.3, torch.Generator().manual_seed(mask_seed(7, 4)), "geometric")
    assert torch.equal(msg.idx, idx) and torch.equal(msg.values, before[idx])
    index_bytes = {"seed": None, "gaps": 8 + GapsIndex().payload_bytes(idx, D), "bitmask": 8 + math.ceil(D / 8)}[index]
    assert msg.bytes_by_tag() == ({"params": len(idx) * 4} | ({} if index_bytes is None else {"index": index_bytes}))
    got = neighbour_values(len(idx))
    rk.apply(msg, {j: Incoming(v, msg.index) for j, v in got.items()})
    expected = before.clone()
    expected[idx] = 0.5 * before[idx] + 0.2 * got[0] + 0.3 * got[2]
    torch.testing.assert_close(x, expected)


def test_random_k_rejects_a_neighbour_with_other_indices():
    rk, _ = bound(RandomK(0.3, "bitmask", "bernoulli", seed=1))
    msg, other = rk.message(0), rk.message(1)
    with pytest.raises(RuntimeError, match="rank 2"):
        rk.apply(msg, {0: Incoming(msg.values, msg.index), 2: Incoming(msg.values, other.index)})


def test_random_k_with_p_one_is_dense():
    rk, x = bound(RandomK(1.0, "gaps", "geometric", seed=0))
    dense, y = bound(Dense())
    a, b = rk.message(0), dense.message(0)
    assert a.idx is None and a.index is None and a.bytes_by_tag() == b.bytes_by_tag()
    got = {j: Incoming(v) for j, v in neighbour_values(D).items()}
    rk.apply(a, got)
    dense.apply(b, got)
    assert torch.equal(x, y)


def test_top_k_sends_the_largest_changes_and_keeps_the_rest_for_later():
    topk, x = bound(TopK(0.1, "bitmask", gamma=0.5))
    start = x.clone()
    signs = torch.tensor([(-1.0) ** i for i in range(D)])
    x += signs * torch.arange(D) / D  # changes since the copies were made; the last k are the largest
    msg = topk.message(0)
    k = round(0.1 * D)
    expected_idx = torch.arange(D - k, D)
    assert torch.equal(msg.idx, expected_idx)
    torch.testing.assert_close(msg.values, (x - start)[expected_idx])
    assert msg.bytes_by_tag() == {"params": k * 4, "index": 16 + math.ceil(D / 8)}  # (index length, k) header
    own = start.clone()
    own[expected_idx] = x[expected_idx]
    torch.testing.assert_close(topk.copies[1], own)  # error feedback: the rest stays in x - copy


def test_top_k_applies_chocos_consensus_step():
    topk, x = bound(TopK(0.1, "gaps", gamma=0.5))
    copies = {j: c.clone() for j, c in topk.copies.items()}
    before, idx = x.clone(), torch.tensor([3, 9, 20])
    enc = GapsIndex().encode(idx, D)
    got = {j: Incoming(torch.full((3,), float(j + 1)), enc) for j in MIXING.peers}
    me = topk.message(0)  # nothing changed yet: sends zeros, own copy stays
    topk.apply(me, got)
    for j in MIXING.peers:
        copies[j][idx] += got[j].values
        torch.testing.assert_close(topk.copies[j], copies[j])
    pull = 0.2 * (copies[0] - copies[1]) + 0.3 * (copies[2] - copies[1])
    torch.testing.assert_close(x, before + 0.5 * pull)


def test_top_k_state_round_trips():
    topk, x = bound(TopK(0.2, "gaps", gamma=1.0))
    x += 1
    topk.message(0)
    state = {k: v.clone() for k, v in topk.state_dict().items()}
    other, _ = bound(TopK(0.2, "gaps", gamma=1.0), seed=3)
    other.load_state_dict(state)
    for j in topk.copies:
        assert torch.equal(other.copies[j], topk.copies[j])


# ---- value codecs (method.codec) ---------------------------------------------------------------------
def test_dense_through_fp16_sends_half_the_bytes_and_mixes_what_arrives():
    from lowband.comm.value_codecs import parse_codec

    dense = Dense()
    x = torch.randn(D, generator=torch.Generator().manual_seed(3))
    dense.bind(x, MIXING, Timers(), parse_codec("fp16"))
    before = x.clone()
    msg = dense.message(0)
    assert msg.bytes_by_tag() == {"params": D * 2}
    sent = {j: torch.randn(D, generator=torch.Generator().manual_seed(j)) for j in MIXING.peers}
    payloads = {j: Incoming(torch.from_numpy(v.numpy().astype("float16")).view(torch.uint8)) for j, v in sent.items()}
    dense.apply(msg, payloads)
    as16 = {j: torch.from_numpy(v.numpy().astype("float16").astype("float32")) for j, v in sent.items()}
    torch.testing.assert_close(x, 0.5 * before + 0.2 * as16[0] + 0.3 * as16[2])


def test_random_k_through_int8_counts_the_codecs_exact_bytes():
    from lowband.comm.value_codecs import parse_codec

    codec = parse_codec("int8")
    rk = RandomK(0.3, "seed", "geometric", seed=7)
    rk.bind(torch.randn(D), MIXING, Timers(), codec)
    msg = rk.message(2)
    assert msg.bytes_by_tag() == {"params": codec.payload_bytes(len(msg.idx))}


@pytest.mark.parametrize("spec", ["int8", "int4:stochastic", "bf16"])
def test_top_k_copies_stay_equal_everywhere_through_a_lossy_codec(spec):
    """Three nodes, each the others' neighbour, in one process: after every step each node's copy of
    node j equals node j's own public copy, bit for bit (CHOCO's invariant), however lossy the codec."""
    from lowband.comm.value_codecs import parse_codec

    world = 3
    nodes = []
    x0 = torch.randn(D, generator=torch.Generator().manual_seed(0))
    for rank in range(world):
        peers = [j for j in range(world) if j != rank]
        node = TopK(0.2, "gaps", 0.5)
        node.bind(x0.clone(), Mixing(rank, peers, 1 / 3, {j: 1 / 3 for j in peers}), Timers(),
                  parse_codec(spec, seed=rank))
        nodes.append(node)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        for node in nodes:  # local training moves each node differently
            node.x.add_(torch.randn(D, generator=gen))
        msgs = [node.message(step) for node in nodes]
        for rank, node in enumerate(nodes):
            node.apply(msgs[rank], {j: Incoming(msgs[j].values, msgs[j].index) for j in node.mixing.peers})
        for i in range(world):
            for j in range(world):
                assert torch.equal(nodes[i].copies[j], nodes[j].copies[j]), (step, i, j)
