"""random_indices: both samplers draw each coordinate independently with probability p."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lowband.comm.masks import geometric_gaps, random_indices

SAMPLERS = ["geometric", "bernoulli"]
CHI2_999 = {9: 27.88, 5: 20.52}  # chi-square critical values at 0.1% for df 9 and 5


def draws(method: str, numel: int, p: float, n: int, seed0: int = 0) -> list[torch.Tensor]:
    return [random_indices(numel, p, torch.Generator().manual_seed(seed0 + s), method) for s in range(n)]


@pytest.mark.parametrize("method", SAMPLERS)
def test_edges_and_shape(method):
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(random_indices(7, 1.0, gen, method), torch.arange(7))
    assert random_indices(7, 0.0, gen, method).numel() == 0
    idx = random_indices(10_000, 0.3, gen, method)
    assert idx.dtype == torch.int64 and idx.min() >= 0 and idx.max() < 10_000
    assert torch.equal(idx, idx.unique())  # sorted and distinct
    with pytest.raises(ValueError):
        random_indices(10, 1.5, gen, method)


@pytest.mark.parametrize("method", SAMPLERS)
def test_same_generator_state_same_indices(method):
    a = random_indices(5000, 0.1, torch.Generator().manual_seed(42), method)
    b = random_indices(5000, 0.1, torch.Generator().manual_seed(42), method)
    c = random_indices(5000, 0.1, torch.Generator().manual_seed(43), method)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("method", SAMPLERS)
@pytest.mark.parametrize("p", [0.01, 0.2])
def test_count_is_binomial(method, p):
    numel, n = 20_000, 300
    counts = np.array([len(i) for i in draws(method, numel, p, n)], dtype=float)
    mean, var = numel * p, numel * p * (1 - p)
    assert abs(counts.mean() - mean) < 5 * math.sqrt(var / n)  # 5 standard errors
    assert 0.7 < counts.var(ddof=1) / var < 1.4  # sample variance of 300 draws: ~8% sd


@pytest.mark.parametrize("method", SAMPLERS)
def test_positions_are_uniform(method):
    numel = 10_000
    pooled = torch.cat(draws(method, numel, 0.05, 100)).numpy()
    observed = np.bincount(pooled * 10 // numel, minlength=10)
    expected = len(pooled) / 10
    assert ((observed - expected) ** 2 / expected).sum() < CHI2_999[9]


@pytest.mark.parametrize("method", SAMPLERS)
def test_gaps_are_geometric(method):
    p = 0.2
    gaps = np.concatenate([np.diff(i.numpy()) for i in draws(method, 5000, p, 100)])
    pmf = np.array([(1 - p) ** (k - 1) * p for k in range(1, 6)])
    observed = np.array([(gaps == k).sum() for k in range(1, 6)] + [(gaps > 5).sum()])
    expected = np.append(pmf, 1 - pmf.sum()) * len(gaps)
    assert ((observed - expected) ** 2 / expected).sum() < CHI2_999[5]
    assert abs(gaps.mean() - 1 / p) < 0.05 / p


def test_both_samplers_have_the_same_count_distribution():
    g = np.array([len(i) for i in draws("geometric", 10_000, 0.1, 300)], float)
    b = np.array([len(i) for i in draws("bernoulli", 10_000, 0.1, 300, seed0=10_000)], float)
    se = math.sqrt(g.var(ddof=1) / 300 + b.var(ddof=1) / 300)
    assert abs(g.mean() - b.mean()) < 5 * se


def test_geometric_gaps_start_at_one():
    gaps = geometric_gaps(100_000, 0.5, torch.Generator().manual_seed(0))
    assert gaps.min() == 1 and abs(float((gaps == 1).float().mean()) - 0.5) < 0.01


@pytest.mark.parametrize("method", SAMPLERS)
def test_the_global_rng_is_untouched(method):
    torch.manual_seed(123)
    state = torch.get_rng_state()
    random_indices(10_000, 0.1, torch.Generator().manual_seed(1), method)
    assert torch.equal(torch.get_rng_state(), state)
