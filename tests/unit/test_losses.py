"""Distillation losses and ensemble weights against independent NumPy computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lowband.distill.losses import diversity_penalty, ensemble_weights, soft_cross_entropy


def random_probs(k: int, n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(k, n, c, generator=gen, dtype=torch.float64), dim=2)
    return probs, torch.randint(0, c, (n,), generator=gen)


def numpy_weights(p: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    k, n, c = p.shape
    if method == "simple":
        return np.full((k, n), 1 / k)
    if method == "regression":
        design = np.stack([p[j].reshape(-1) for j in range(k)], axis=1)  # (n*c, k), rows (sample, class)
        onehot = np.eye(c)[y].reshape(-1)
        alpha = np.linalg.lstsq(design, onehot, rcond=None)[0]
        return np.repeat(alpha[:, None], n, axis=1)
    out = np.empty((k, n))
    for i in range(n):
        margins = []
        for j in range(k):
            rest = np.delete(p[j, i], y[i])
            margins.append(max(p[j, i, y[i]] - rest.max(), 0.0))
        margins = np.array(margins)
        out[:, i] = margins / margins.sum() if margins.sum() > 0 else 1 / k
    return out


@pytest.mark.parametrize("method", ["simple", "regression", "margin"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ensemble_weights_match_numpy(method, seed):
    probs, y = random_probs(4, 50, 6, seed)
    got = ensemble_weights(probs, y, method)
    assert got.shape == (4, 50)
    np.testing.assert_allclose(got.numpy(), numpy_weights(probs.numpy(), y.numpy(), method), rtol=1e-6, atol=1e-9)


def test_margin_is_uniform_where_every_model_is_wrong():
    probs = torch.tensor([[[0.9, 0.1]], [[0.6, 0.4]]], dtype=torch.float64)  # both prefer class 0
    w = ensemble_weights(probs, torch.tensor([1]), "margin")
    assert torch.equal(w, torch.full((2, 1), 0.5, dtype=torch.float64))


@pytest.mark.parametrize("method", ["regression", "margin"])
def test_labels_are_required(method):
    probs, _ = random_probs(2, 3, 4, 0)
    with pytest.raises(ValueError, match="labels"):
        ensemble_weights(probs, None, method)
    with pytest.raises(ValueError, match="method"):
        ensemble_weights(probs, None, "median")


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 6), n=st.integers(1, 20), c=st.integers(2, 8), seed=st.integers(0, 10**6),
       scale=st.floats(0.1, 20))
def test_simple_ensemble_cross_entropy_is_at_most_mean_member_cross_entropy(k, n, c, seed, scale):
    """Cross-entropy is convex in the output (the EC-DNN paper's Eq. 4)."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(scale * torch.randn(k, n, c, generator=gen, dtype=torch.float64), dim=2)
    y = torch.randint(0, c, (n,), generator=gen)
    mixed = (ensemble_weights(probs, y, "simple")[:, :, None] * probs).sum(0)
    ensemble_ce = F.nll_loss(mixed.log(), y)
    member_ce = torch.stack([F.nll_loss(p.log(), y) for p in probs]).mean()
    assert ensemble_ce <= member_ce + 1e-12


def test_soft_cross_entropy_matches_numpy():
    logits, target = torch.randn(5, 3, dtype=torch.float64), torch.softmax(torch.randn(5, 3, dtype=torch.float64), 1)
    lg = logits.numpy()
    log_softmax = lg - np.log(np.exp(lg).sum(1, keepdims=True))
    np.testing.assert_allclose(soft_cross_entropy(logits, target).numpy(), -(target.numpy() * log_softmax).sum(1))


def test_diversity_penalty_pushes_outputs_away_from_the_mean_output():
    logits = torch.randn(8, 5, requires_grad=True)
    mean = torch.softmax(torch.randn(8, 5), 1)
    before = (torch.softmax(logits, 1) - mean).pow(2).sum(1)
    diversity_penalty(logits, mean).sum().backward()
    with torch.no_grad():
        after = (torch.softmax(logits - 0.5 * logits.grad, 1) - mean).pow(2).sum(1)  # one descent step
    assert (after > before).all()
    np.testing.assert_allclose(diversity_penalty(logits, mean).detach().numpy(), -before.detach().numpy(), rtol=1e-6)
