"""Gathering or averaging every rank's model: one all-gather or one allreduce of the flat state.

Model averaging serves local SGD, DiLoCo, gossip and EC-DNN alike, so it lives in the comm
layer, below every method and below distillation.
"""

from __future__ import annotations

import copy

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
