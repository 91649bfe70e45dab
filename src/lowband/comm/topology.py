"""Who talks to whom: pure functions of (name, rank, world), no process group needed.

Mixing weights are Metropolis-Hastings weights, W_ij = 1 / (1 + max(deg_i, deg_j)) for neighbours
and W_ii = 1 - sum of the rest, which makes W symmetric and doubly stochastic for any graph. On a
ring of K >= 3 that is 1/3 for the node and each neighbour; on the complete graph 1/K everywhere.
"""

from __future__ import annotations

import math

import torch

from lowband.errors import ConfigError

TOPOLOGIES = ("ring", "torus", "complete")


def torus_shape(world: int) -> tuple[int, int]:
    """The most square rows x cols = world with both sides >= 2."""
    for rows in range(int(math.isqrt(world)), 1, -1):
        if world % rows == 0:
            return rows, world // rows
    raise ConfigError("method.topology", "torus", f"{world} workers cannot form a torus (need rows x cols, both >= 2)")


def neighbours(name: str, rank: int, world: int) -> list[int]:
    """Sorted distinct neighbours of `rank` (never itself)."""
    if world < 2:
        return []
    if name == "ring":
        found = {(rank - 1) % world, (rank + 1) % world}
    elif name == "complete":
        found = set(range(world))
    elif name == "torus":
        rows, cols = torus_shape(world)
        r, c = divmod(rank, cols)
        found = {((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c, r * cols + (c - 1) % cols,
                 r * cols + (c + 1) % cols}
    else:
        raise ConfigError("method.topology", name, "must be one of " + ", ".join(TOPOLOGIES))
    return sorted(found - {rank})


def mixing_matrix(name: str, world_size: int) -> torch.Tensor:
    """(K, K) float64 mixing matrix: symmetric, rows and columns sum to 1, non-zero only on edges."""
    nbrs = [neighbours(name, i, world_size) for i in range(world_size)]
    w = torch.zeros(world_size, world_size, dtype=torch.float64)
    for i in range(world_size):
        for j in nbrs[i]:
            w[i, j] = 1.0 / (1 + max(len(nbrs[i]), len(nbrs[j])))
        w[i, i] = 1.0 - w[i].sum()
    return w
