"""Split a training set over K workers: iid shards, Dirichlet label skew, or the same data for all.

Partitions are pure functions of (labels, K, seed): every rank computes all K shards itself, so
no indices cross the wire and every rank knows every shard's size.
"""

from __future__ import annotations

import numpy as np
import torch

from lowband.errors import ConfigError


def partition(labels: torch.Tensor, workers: int, mode: str, seed: int, alpha: float = 0.5) -> list[torch.Tensor]:
    """Return one sorted int64 index tensor per worker. `labels` may be per-position targets (N, T)
    (text): iid and same split rows; dirichlet needs one class label per sample."""
    n = len(labels)
    rng = np.random.default_rng(seed)
    if mode == "same":
        shards = [np.arange(n)] * workers
    elif mode == "iid":
        shards = np.array_split(rng.permutation(n), workers)
    elif mode == "dirichlet":
        if labels.dim() != 1:
            raise ConfigError("data.partition", mode, "needs one class label per sample; this data (text) has a "
                                                      "target per position: use 'iid' or 'same'")
        shards = _dirichlet(labels.numpy(), workers, alpha, rng)
    else:
        raise ConfigError("data.partition", mode, "must be one of 'iid', 'dirichlet', 'same'")
    return [torch.as_tensor(np.sort(s), dtype=torch.int64) for s in shards]


def _dirichlet(labels: np.ndarray, workers: int, alpha: float, rng, tries: int = 100) -> list[np.ndarray]:
    """Per class, split its samples over workers in proportions drawn from Dir(alpha)."""
    for _ in range(tries):
        shards: list[list[np.ndarray]] = [[] for _ in range(workers)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * workers))[:-1] * len(idx)).astype(int)
            for k, part in enumerate(np.split(idx, cuts)):
                shards[k].extend(part.tolist())
        if min(len(s) for s in shards) > 0:
            return [np.asarray(s, dtype=np.int64) for s in shards]
    raise ConfigError("data.alpha", alpha, f"too skewed: some of the {workers} workers got no data; raise it")


def steps_per_epoch(shards: list[torch.Tensor], batch_size: int, field: str = "train.batch_size") -> int:
    """Full batches every worker can take per epoch (equal on all ranks, so collectives match)."""
    smallest = min(len(s) for s in shards)
    if batch_size > smallest:
        raise ConfigError(field, batch_size, f"must be <= {smallest}, the smallest worker's shard")
    return smallest // batch_size
