"""Gathering or averaging every rank's model, and an output ensemble of models as one module."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lowband.models.flat import flat_state, load_flat


def gather_models(comm, model: nn.Module, tag: str) -> list[nn.Module]:
    """Every rank's copy of `model`'s architecture holding that rank's current state, in rank order."""
    members = []
    for vector in comm.all_gather(flat_state(model), tag=tag):
        member = copy.deepcopy(model).eval()
        load_flat(member, vector)
        members.append(member)
    return members


def average_models(comm, model: nn.Module, tag: str) -> None:
    """Replace `model`'s parameters and floating buffers by their mean over all ranks (one allreduce)."""
    vector = flat_state(model)
    comm.allreduce(vector, tag=tag, mean=True)
    load_flat(model, vector)


def averaged_copy(comm, model: nn.Module, tag: str) -> nn.Module:
    """A copy of `model` holding the mean over all ranks; `model` itself is left alone."""
    averaged = copy.deepcopy(model)
    average_models(comm, averaged, tag)
    return averaged


class Ensemble(nn.Module):
    """G(x) = sum_k w_k softmax(f_k(x)); forward returns log G(x), so argmax and NLL work on it."""

    def __init__(self, members: list[nn.Module], weights: torch.Tensor | None = None):
        super().__init__()
        self.members = nn.ModuleList(members)
        k = len(members)
        self.register_buffer("weights", torch.full((k,), 1.0 / k) if weights is None else weights.clone().float())

    @torch.no_grad()
    def member_probs(self, x: torch.Tensor) -> torch.Tensor:
        """(K, N, C) softmax outputs of every member on x."""
        return torch.stack([torch.softmax(m(x), dim=1) for m in self.members])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([torch.softmax(m(x), dim=1) for m in self.members])
        mixed = (self.weights.view(-1, 1, 1) * probs).sum(0)
        return mixed.clamp_min(1e-12).log()  # regression weights may be negative: clamp before the log
