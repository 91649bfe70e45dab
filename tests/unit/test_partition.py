"""Partitioners: disjoint and complete shards, label skew, equal step counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowband.data import partition, steps_per_epoch
from lowband.errors import ConfigError


def labels(n: int, classes: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(10, 500), k=st.integers(1, 8), seed=st.integers(0, 10**6),
       mode=st.sampled_from(["iid", "dirichlet"]), alpha=st.floats(0.3, 10))
def test_shards_are_disjoint_and_complete(n, k, seed, mode, alpha):
    if mode == "dirichlet" and n < 10 * k:
        return  # too few samples for every worker to get some under skew
    shards = partition(labels(n, seed=seed), k, mode, seed, alpha)
    assert len(shards) == k
    together = torch.cat(shards)
    assert len(together) == n and torch.equal(together.sort().values, torch.arange(n))
    assert all(len(s) > 0 for s in shards)


def test_iid_shards_are_balanced_and_depend_on_seed():
    y = labels(1000)
    shards = partition(y, 3, "iid", seed=1)
    assert sorted(len(s) for s in shards) == [333, 333, 334]
    assert not torch.equal(shards[0], partition(y, 3, "iid", seed=2)[0])
    assert torch.equal(shards[0], partition(y, 3, "iid", seed=1)[0])


def test_same_gives_everyone_everything():
    shards = partition(labels(50), 4, "same", seed=0)
    assert all(torch.equal(s, torch.arange(50)) for s in shards)


def test_dirichlet_small_alpha_skews_labels_more_than_iid():
    y = labels(5000, seed=3)

    def skew(shards):  # mean over workers of the largest class share
        return sum(torch.bincount(y[s], minlength=10).max().item() / len(s) for s in shards) / len(shards)

    assert skew(partition(y, 4, "dirichlet", 0, alpha=0.1)) > 0.4
    assert skew(partition(y, 4, "iid", 0)) < 0.15


def test_steps_per_epoch_uses_smallest_shard_and_rejects_too_large_batches():
    shards = [torch.arange(100), torch.arange(37)]
    assert steps_per_epoch(shards, 10) == 3
    with pytest.raises(ConfigError) as e:
        steps_per_epoch(shards, 38)
    assert e.value.field == "train.batch_size" and "<= 37" in str(e.value)
