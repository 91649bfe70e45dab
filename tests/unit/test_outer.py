"""The outer step of DiLoCo and local SGD in one process: methods/outer.py's Fragment against a NumPy
Nesterov SGD, and methods/elastic_outer.py's step over a quorum whose non-contributors send zeros.

The communicators are stand-ins: a world of one (the real Communicator), or `OtherRanks`, whose
allreduce adds what the other ranks of a quorum would have sent.
"""

import numpy as np
import pytest
import torch

from lowband.comm.communicator import Communicator
from lowband.comm.value_codecs import parse_codec
from lowband.methods.diloco import DiLoCo, DiLoCoConfig
from lowband.methods.elastic_outer import ElasticOuter
from lowband.methods.local_sgd import LocalSGD, LocalSGDConfig
from lowband.methods.outer import Fragment


def nesterov_reference(anchor: np.ndarray, grads: list[np.ndarray], lr: float, momentum: float) -> list[np.ndarray]:
    """θ after each step of SGD with Nesterov momentum (Sutskever et al.; torch's form: the first buffer is
    the gradient itself): b <- m·b + g, θ <- θ - lr·(g + m·b)."""
    out, buf = [], None
    for g in grads:
        buf = g.copy() if buf is None else momentum * buf + g
        anchor = anchor - lr * (g + momentum * buf)
        out.append(anchor)
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_fragment_takes_nesterov_steps_with_the_pseudo_gradient(momentum):
    lr, rng = 0.7, np.random.default_rng(0)
    param = torch.nn.Parameter(torch.tensor(rng.normal(size=6), dtype=torch.float64))
    frag = Fragment([param], lr, momentum, parse_codec("fp32"), feedback=False)
    anchor, grads, got = param.detach().numpy().copy(), [], []
    for step in range(4):
        with torch.no_grad():  # local training moved θ_local; merge θ_global back after the sync
            param.add_(torch.tensor(rng.normal(size=6)))
        grads.append(frag.anchor.detach().numpy() - param.detach().numpy())
        frag.sync(Communicator(), "params", step, delay=0)
        got.append(frag.anchor.detach().numpy().copy())
        frag.merge(1.0)
    for mine, ref in zip(got, nesterov_reference(anchor, grads, lr, momentum), strict=True):
        np.testing.assert_allclose(mine, ref, rtol=1e-12)


class OtherRanks:
    """Rank 0 of a quorum of `world` members without processes: allreduce adds the vectors the other
    ranks send (`others`, in the order of the calls) to this rank's."""

    p2p = True

    def __init__(self, world: int, others: list[torch.Tensor]):
        self.rank, self.world, self.others = 0, world, list(others)

    def allreduce(self, tensor: torch.Tensor, tag: str, mean: bool = False) -> torch.Tensor:
        tensor += self.others.pop(0)
        return tensor.div_(self.world) if mean else tensor


def model_at(values: list[float]) -> torch.nn.Module:
    model = torch.nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))
    return model


def test_the_elastic_step_averages_over_the_contributors_not_the_members():
    """Three members, two contributors: local SGD's outer step (lr 1, no momentum) makes θ_global the
    mean of the two contributors' θ_local; the third member's zeros do not pull it towards θ_global."""
    model = model_at([1.0, 2.0, 3.0])
    outer = ElasticOuter.of(model, LocalSGD, LocalSGDConfig(tau=2), seed=0)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 2.0, 1.0]]))  # this rank trained
    other_local = torch.tensor([2.0, 6.0, 5.0])  # the other contributor's θ_local
    delta_other = torch.tensor([1.0, 2.0, 3.0]) - other_local
    outer.average(OtherRanks(3, [delta_other]), round_no=0, contributors=2, contribute=True, step=True)
    expected = (torch.tensor([3.0, 2.0, 1.0]) + other_local) / 2
    torch.testing.assert_close(outer.fragments[0].anchor.detach(), expected)


def test_the_elastic_diloco_step_is_one_outer_step_with_the_contributors_mean():
    """Four members, two contributors with Δ 1 and 3: θ_global moves by outer_lr · 2, not outer_lr · 1."""
    model = model_at([1.0, 2.0, 3.0, 4.0])
    cfg = DiLoCoConfig(tau=2, outer_lr=0.5, outer_momentum=0.0)
    outer = ElasticOuter.of(model, DiLoCo, cfg, seed=0)
    with torch.no_grad():
        model.weight.sub_(1.0)  # this rank's Δ: all ones
    others = torch.full((4,), 3.0) + torch.zeros(4) + torch.zeros(4)  # one more contributor, two receivers' zeros
    outer.average(OtherRanks(4, [others]), round_no=0, contributors=2, contribute=True, step=True)
    torch.testing.assert_close(outer.fragments[0].anchor.detach(), torch.tensor([1.0, 2.0, 3.0, 4.0]) - 0.5 * 2.0)
