"""What an elastic receiver takes from a round's source (methods/diloco.py's `receive`): the source's θ_global
of every fragment, in its own anchors and in its local model, the source's clock, and a fresh error-feedback
residual (the one it held belonged to pseudo-gradients of another θ_global).

The methods run in one process over a world of one; the source's state is packed and unpacked as on the wire.
"""

from __future__ import annotations

import logging

import pytest
import torch

from lowband.comm import Communicator
from lowband.comm.quorum import pack_state, unpack_state
from lowband.config import Config, ModelConfig, TrainConfig
from lowband.methods.base import Context
from lowband.methods.diloco import DiLoCo, DiLoCoConfig
from lowband.methods.sparseloco import SparseLoCo, SparseLoCoConfig
from lowband.models import build_model

METHODS = {
    "streaming diloco, int8": (DiLoCo, lambda: DiLoCoConfig(tau=4, fragments=2, codec="int8")),
    "sparseloco, 2 fragments": (SparseLoCo, lambda: SparseLoCoConfig(tau=4, fragments=2, density=0.25, chunk=16)),
}


def built(kind: str, seed: int):
    """The method set up on a small MLP, its θ_local moved away from θ_global as local steps would."""
    cls, make = METHODS[kind]
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name="mlp", hidden=16), (1, 40), 5)
    ctx = Context(Config(method=make(), train=TrainConfig(epochs=1, seed=seed)), Communicator(), torch.device("cpu"),
                  logging.getLogger("t"), "", 20)
    method = cls(make(), ctx)
    method.setup(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return method, model


def held_residuals(method) -> list[torch.Tensor | None]:
    return [f.feedback.residual if f.feedback is not None else None for f in method.fragments]


@pytest.mark.parametrize("kind", list(METHODS))
def test_a_receiver_takes_theta_global_of_every_fragment_into_its_local_model(kind):
    source, _ = built(kind, 0)
    for frag in source.fragments:  # the source's θ_global has moved on from where both started
        with torch.no_grad():
            frag.anchor.add_(0.5)
    source.steps, source.outer_steps = 37, 9
    source.fragments[1].apply_at = 40  # a fragment in flight: its merge is due later
    receiver, local = built(kind, 1)
    sent = pack_state({"shared": source.shared_state(), "extra": source.handover()})
    got = unpack_state(sent)
    receiver.receive(got["shared"], got["extra"])
    assert (receiver.steps, receiver.outer_steps) == (37, 9)
    want = torch.cat([f.anchor.detach() for f in source.fragments])
    mine = torch.cat([f.anchor.detach() for f in receiver.fragments])
    torch.testing.assert_close(mine, want, rtol=0, atol=0)
    flat_local = torch.cat([p.detach().reshape(-1) for p in local.parameters()])
    torch.testing.assert_close(flat_local, want, rtol=0, atol=0)  # every fragment, not only the one due
    assert [f.apply_at for f in receiver.fragments] == [f.apply_at for f in source.fragments]


@pytest.mark.parametrize("kind", list(METHODS))
def test_a_receiver_starts_its_error_feedback_over(kind):
    source, _ = built(kind, 0)
    receiver, _ = built(kind, 1)
    for frag in receiver.fragments:  # what it dropped from pseudo-gradients of its old θ_global
        assert frag.feedback is not None
        frag.feedback.residual = torch.ones_like(frag.anchor)
    got = unpack_state(pack_state({"shared": source.shared_state(), "extra": source.handover()}))
    receiver.receive(got["shared"], got["extra"])
    for residual in held_residuals(receiver):
        assert residual is None or not residual.any()
