"""Random coordinate subsets for random-k sparsification, drawn on a private torch.Generator.

Each coordinate is included independently with probability p. `bernoulli` draws one uniform per
coordinate (O(d)); `geometric` draws only the gaps between chosen coordinates, which are
Geometric(p), so its cost is O(p d) (geometric skip sampling, as in the RD-PSGD paper). Both give
the same distribution. The global RNG is never touched: dropout, shuffling and augmentation are
unaffected by masking.
"""

from __future__ import annotations

import math

import torch


def random_indices(numel: int, p: float, generator: torch.Generator, method: str = "geometric") -> torch.Tensor:
    """Sorted int64 tensor of distinct indices in [0, numel), each included with probability p."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p}: must be in [0, 1]")
    if p == 0.0 or numel == 0:
        return torch.empty(0, dtype=torch.int64)
    if p == 1.0:
        return torch.arange(numel, dtype=torch.int64)
    if method == "bernoulli":
        return (torch.rand(numel, generator=generator) < p).nonzero().squeeze(1)
    if method == "geometric":
        return _geometric(numel, p, generator)
    raise ValueError(f"method={method!r}: must be 'geometric' or 'bernoulli'")


def geometric_gaps(count: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """`count` draws of Geometric(p) on {1, 2, ...}: floor(log(U) / log(1 - p)) + 1, U in (0, 1]."""
    u = 1.0 - torch.rand(count, generator=generator, dtype=torch.float64)
    return (torch.log(u) / math.log1p(-p)).floor_().to(torch.int64) + 1


def _geometric(numel: int, p: float, generator: torch.Generator) -> torch.Tensor:
    mean = numel * p
    chunk = int(mean + 6 * math.sqrt(mean * (1 - p)) + 16)  # enough in one draw almost always
    parts, position = [], -1
    while position < numel:
        positions = position + torch.cumsum(geometric_gaps(chunk, p, generator), 0)
        parts.append(positions)
        position = int(positions[-1])
    out = torch.cat(parts)
    return out[out < numel]
