"""Models as flat vectors: for exchanging, averaging and mixing them with one tensor operation."""

from __future__ import annotations

import torch
from torch import nn


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors that define a model's function: parameters and floating buffers (BatchNorm stats)."""
    return list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]


def flat_state(model: nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in state_tensors(model)])


@torch.no_grad()
def load_flat(model: nn.Module, vector: torch.Tensor) -> None:
    offset = 0
    for t in state_tensors(model):
        t.copy_(vector[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


@torch.no_grad()
def bind_flat_parameters(model: nn.Module) -> torch.Tensor:
    """Move every parameter into one contiguous vector and return it; parameters become views of it.

    The Parameter objects stay the same (an optimizer built on them keeps working), so writing
    into the vector changes the model without copying.
    """
    params = list(model.parameters())
    vector = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        p.data = vector[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return vector
