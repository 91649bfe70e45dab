"""Pure loss and weighting functions: tensors in, tensors out, no process group.

`kd_loss` is the student loss of EDL-Dist (Dong et al., "Elastic Deep Learning using Knowledge
Distillation with Heterogeneous Computing Resources"), after Hinton et al. 2015.

`ensemble_weights` implements the three aggregations of EC-DNN (Sun et al., "Ensemble-Compression:
A New Method for Parallel Training of Deep Neural Networks"): simple, regression and margin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ensemble_weights(probs: torch.Tensor, labels: torch.Tensor | None = None, method: str = "simple") -> torch.Tensor:
    """Weights (K, N) of K models' softmax outputs `probs` (K, N, C) in an output ensemble.

    simple: 1/K everywhere. regression: the unconstrained least-squares alpha in R^K minimising
    sum_n ||onehot(y_n) - sum_k alpha_k probs[k, n]||^2, the same for every sample. margin: per
    sample, max(p_k[y] - max_{i != y} p_k[i], 0) normalised over k; 1/K where every margin is 0.
    """
    k, n, c = probs.shape
    if method == "simple":
        return torch.full((k, n), 1.0 / k, dtype=probs.dtype, device=probs.device)
    if method not in ("regression", "margin"):
        raise ValueError(f"method={method!r}: must be 'simple', 'regression' or 'margin'")
    if labels is None:
        raise ValueError(f"labels is required for method={method!r}")
    if method == "regression":
        design = probs.permute(1, 2, 0).reshape(n * c, k).double()
        target = F.one_hot(labels, c).reshape(n * c, 1).double()
        alpha = torch.linalg.lstsq(design, target, driver="gelsd").solution.reshape(k)
        return alpha.to(probs.dtype)[:, None].expand(k, n).clone()
    true = probs.gather(2, labels.view(1, n, 1).expand(k, n, 1)).squeeze(2)
    others = probs.scatter(2, labels.view(1, n, 1).expand(k, n, 1), float("-inf")).amax(2)
    margin = (true - others).clamp_min(0)
    total = margin.sum(0, keepdim=True)
    return torch.where(total > 0, margin / total.clamp_min(1e-30), torch.full_like(margin, 1.0 / k))


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of softmax(logits) against a probability vector (the last dimension
    holds the classes: a language model's logits give one value per position)."""
    return -(target_probs * F.log_softmax(logits, dim=-1)).sum(-1)


def diversity_penalty(logits: torch.Tensor, mean_probs: torch.Tensor) -> torch.Tensor:
    """EC-DNN's similarity loss L_sim = -||softmax(logits) - mean_probs||^2, per sample.

    Adding alpha * L_sim to the loss and minimising it pushes the output away from the mean
    output of the latest compressed models (more diverse local models).
    """
    return -(F.softmax(logits, dim=-1) - mean_probs).pow(2).sum(-1)


def codistill_loss(logits: torch.Tensor, peer_logits, temperature: float = 1.0) -> torch.Tensor:
    """Codistillation (Anil et al. 2018): cross-entropy of softmax(logits / T) against the mean of
    the peers' softmax(peer_logits / T), averaged over the batch, times T^2. No gradient reaches
    the peers."""
    peers = list(peer_logits)
    if not peers:
        raise ValueError("peer_logits must hold at least one tensor")
    target = torch.stack([F.softmax(p.detach() / temperature, dim=-1) for p in peers]).mean(0)
    return soft_cross_entropy(logits / temperature, target).mean() * temperature ** 2


def pairwise_distances(features: torch.Tensor, distance: str = "euclidean") -> torch.Tensor:
    """(n, n) matrix E[k, l] = D(a_k, a_l) for the rows a of `features` (n, d)."""
    if distance == "cosine":
        unit = F.normalize(features, dim=1)
        return 1.0 - unit @ unit.T
    diff = features[:, None, :] - features[None, :, :]
    squared = diff.pow(2).sum(-1)  # exactly 0 on the diagonal
    if distance == "sqeuclidean":
        return squared
    if distance == "euclidean":
        return squared.clamp_min(1e-24).sqrt() * (squared > 0)  # the sqrt's gradient is kept finite at 0
    raise ValueError(f"distance={distance!r}: must be 'euclidean', 'sqeuclidean' or 'cosine'")


def afsd_loss(features: torch.Tensor, peer_features, distance: str = "euclidean", normalize: str = "n") -> torch.Tensor:
    """AFSD feature-space distillation: 1/(m-1) * sum_j g(E, E_j), g = (1/n) sum_kl |E[k,l] - E_j[k,l]|.

    E and E_j are the pairwise-distance matrices of this model's and peer j's features on the
    same batch. normalize "n" divides by n as the AFSD paper does; "n2" by n^2. Gradient flows
    into `features` only. A language model's features (n, T, d) are compared as whole windows (n, T*d).
    """
    peers = list(peer_features)
    if not peers:
        raise ValueError("peer_features must hold at least one tensor")
    if normalize not in ("n", "n2"):
        raise ValueError(f"normalize={normalize!r}: must be 'n' or 'n2'")
    n = features.shape[0]
    mine = pairwise_distances(features.flatten(1), distance)
    scale = n if normalize == "n" else n * n
    terms = [(mine - pairwise_distances(p.detach().flatten(1), distance)).abs().sum() / scale for p in peers]
    return torch.stack(terms).mean()


def kd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, alpha: float = 0.5,
            beta: float = 0.5, temperature: float = 2.0, hard: torch.Tensor | None = None) -> torch.Tensor:
    """Hinton et al.'s distillation loss, as EDL-Dist trains the student:
    alpha * CE(y, student) + beta * T^2 * KL(softmax(teacher / T) || softmax(student / T)), batch mean.
    The T^2 keeps the soft term's gradients on the hard term's scale as T changes. `hard`: the
    CE(y, student) when the caller has it already. A language model's (batch, positions, vocabulary)
    logits count every position as a sample.
    """
    logits, teacher_logits, labels = logits.flatten(0, -2), teacher_logits.flatten(0, -2), labels.flatten()
    hard = F.cross_entropy(logits, labels) if hard is None else hard
    t = temperature
    soft = F.kl_div(F.log_softmax(logits / t, dim=-1), F.log_softmax(teacher_logits.to(logits.dtype) / t, dim=-1),
                    reduction="batchmean", log_target=True)
    return alpha * hard + beta * t * t * soft
