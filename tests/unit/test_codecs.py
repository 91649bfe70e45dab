"""Index codecs: exact round trips and wire sizes equal to the analytic ones."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowband.comm.codecs import HEADER, BitmaskIndex, GapsIndex, SeedIndex


@st.composite
def index_sets(draw):
    numel = draw(st.integers(1, 5000))
    chosen = draw(st.sets(st.integers(0, numel - 1), max_size=numel))
    return torch.tensor(sorted(chosen), dtype=torch.int64), numel


@settings(max_examples=150, deadline=None)
@given(index_sets())
def test_gaps_round_trip_and_size(case):
    idx, numel = case
    payload = GapsIndex().encode(idx, numel)
    assert torch.equal(GapsIndex().decode(payload, numel), idx)
    assert payload.numel() == GapsIndex.analytic_bytes(idx) == GapsIndex().wire_bytes(payload)


@settings(max_examples=150, deadline=None)
@given(index_sets())
def test_bitmask_round_trip_and_size(case):
    idx, numel = case
    payload = BitmaskIndex().encode(idx, numel)
    assert torch.equal(BitmaskIndex().decode(payload, numel), idx)
    assert payload.numel() == math.ceil(numel / 8)


def test_gaps_pick_the_narrowest_width_and_escape_rare_long_gaps():
    dense = torch.arange(0, 1000, 3)  # gaps of 3: one byte each
    assert GapsIndex().encode(dense, 1000).numel() == HEADER + len(dense)
    sparse = torch.cat([torch.arange(100), torch.tensor([5_000_000_000])])  # the last gap exceeds 2**32
    payload = GapsIndex().encode(sparse, 2**33)
    assert torch.equal(GapsIndex().decode(payload, 2**33), sparse)
    assert payload.numel() == HEADER + 101 * 1 + 8  # width 1 wins; one escape of 8 bytes
    medium = torch.tensor([5, 70_000, 4_000_000_000, 4_000_000_001])  # largest gap still fits in 4 bytes
    assert GapsIndex().encode(medium, 2**33).numel() == HEADER + 4 * 4


def test_seed_mode_sends_nothing():
    assert SeedIndex().encode(torch.arange(10), 100).numel() == 0
    assert not SeedIndex.sends_indices


def test_gaps_are_about_one_byte_per_index_for_moderate_p():
    rng = np.random.default_rng(0)
    idx = torch.from_numpy(np.flatnonzero(rng.random(100_000) < 0.1))
    assert GapsIndex.analytic_bytes(idx) < 1.1 * len(idx) + HEADER  # vs 4 bytes for a raw int32 index
