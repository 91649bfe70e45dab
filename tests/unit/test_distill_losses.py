"""codistill_loss and afsd_loss against independent NumPy implementations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lowband.distill.losses import afsd_loss, codistill_loss


def np_softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_codistill(logits, peers, t):
    target = np.mean([np_softmax(p / t) for p in peers], axis=0)
    return float(-(target * np.log(np_softmax(logits / t))).sum(1).mean() * t * t)


def np_distances(a, kind):
    n = len(a)
    e = np.zeros((n, n))
    for k in range(n):
        for m in range(n):
            diff = a[k] - a[m]
            if kind == "euclidean":
                e[k, m] = np.sqrt((diff ** 2).sum())
            elif kind == "sqeuclidean":
                e[k, m] = (diff ** 2).sum()
            else:
                e[k, m] = 1 - a[k] @ a[m] / (np.linalg.norm(a[k]) * np.linalg.norm(a[m]))
    return e


def np_afsd(a, peers, kind, norm):
    n = len(a)
    scale = n if norm == "n" else n * n
    return float(np.mean([np.abs(np_distances(a, kind) - np_distances(p, kind)).sum() / scale for p in peers]))


@pytest.mark.parametrize("t", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("m", [2, 4])
def test_codistill_loss_matches_numpy(t, m):
    gen = torch.Generator().manual_seed(int(t * 10 + m))
    logits = torch.randn(16, 7, generator=gen, dtype=torch.float64)
    peers = [torch.randn(16, 7, generator=gen, dtype=torch.float64) for _ in range(m - 1)]
    got = codistill_loss(logits, peers, t)
    assert float(got) == pytest.approx(np_codistill(logits.numpy(), [p.numpy() for p in peers], t), rel=1e-9)


@pytest.mark.parametrize("kind", ["euclidean", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("norm", ["n", "n2"])
def test_afsd_loss_matches_numpy(kind, norm):
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(9, 5, generator=gen, dtype=torch.float64)
    peers = [torch.randn(9, 5, generator=gen, dtype=torch.float64) for _ in range(2)]
    got = afsd_loss(a, peers, kind, norm)
    assert float(got) == pytest.approx(np_afsd(a.numpy(), [p.numpy() for p in peers], kind, norm), rel=1e-9)


@pytest.mark.parametrize("kind", ["euclidean", "sqeuclidean", "cosine"])
def test_afsd_loss_is_zero_for_rotated_features_and_positive_otherwise(kind):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    assert float(afsd_loss(a, [a @ rotation, a @ rotation.T], kind)) == pytest.approx(0.0, abs=1e-9)
    assert float(afsd_loss(a, [torch.randn(12, 6, generator=gen, dtype=torch.float64)], kind)) > 0.1


def test_gradients_reach_only_this_models_features():
    a = torch.randn(6, 4, requires_grad=True)
    peer = torch.randn(6, 4, requires_grad=True)
    afsd_loss(a, [peer]).backward()
    assert a.grad is not None and torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    assert peer.grad is None
    logits, peer_logits = torch.randn(5, 3, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    codistill_loss(logits, [peer_logits], 2.0).backward()
    assert logits.grad is not None and peer_logits.grad is None


def test_empty_peer_lists_are_refused():
    with pytest.raises(ValueError, match="peer"):
        afsd_loss(torch.randn(3, 2), [])
    with pytest.raises(ValueError, match="peer"):
        codistill_loss(torch.randn(3, 2), [])


def test_kd_loss_matches_numpy():
    from lowband.distill.losses import kd_loss

    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randn(6, 5, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    T, a, b = 3.0, 0.3, 0.7

    def softmax(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    ps, pt = softmax(s.numpy() / T), softmax(t.numpy() / T)
    ce = -np.log(softmax(s.numpy())[np.arange(6), y.numpy()]).mean()
    kl = (pt * (np.log(pt) - np.log(ps))).sum(1).mean()
    assert kd_loss(s, t, y, a, b, T).item() == pytest.approx(a * ce + b * T * T * kl, rel=1e-10)
