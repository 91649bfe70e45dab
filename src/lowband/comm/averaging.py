"""Gathering or averaging every rank's model: one all-gather or one allreduce of the flat state.

Model averaging serves local SGD, DiLoCo, gossip and EC-DNN alike, so it lives in the comm
layer, below every method and below distillation.
"""

from __future__ import annotations

import copy

from torch import nn

from lowband.comm.value_codecs import Codec
from lowband.models.flat import flat_state, load_flat


def gather_models(comm, model: nn.Module, tag: str, codec: Codec | None = None) -> list[nn.Module]:
    """Every rank's copy of `model`'s architecture holding that rank's current state, in rank order.

    With a lossy `codec` every rank's state travels encoded and every member (this rank's too) is
    the decoded state, so all ranks hold the same members."""
    members = []
    for vector in _gather_states(comm, flat_state(model), tag, codec):
        member = copy.deepcopy(model).eval()
        load_flat(member, vector)
        members.append(member)
    return members


def _gather_states(comm, state, tag: str, codec: Codec | None) -> list:
    if codec is None or codec.lossless:
        return comm.all_gather(state, tag=tag)
    payloads = comm.all_gather(codec.encode(state).to(comm.device), tag=tag)
    return [codec.decode(p.cpu(), state.numel()).to(state.device) for p in payloads]


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
