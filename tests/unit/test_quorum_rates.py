"""The rates of an elastic job follow its quorum (elastic.scale_with_quorum): a round with fewer contributors
than the workers launched takes a smaller outer step (DiLoCo, SparseLoCo: the pseudo-gradients' sum over the
launched workers, an absent one a zero), and local SGD's linearly scaled rate counts the round's contributors.
The reference is NumPy; the methods run in one process over a world of one, as the round's only contributor.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lowband.comm import Communicator
from lowband.comm.quorum import Round
from lowband.config import Config, ElasticConfig, ModelConfig, TrainConfig
from lowband.methods.base import Context
from lowband.methods.diloco import DiLoCo, DiLoCoConfig
from lowband.methods.local_sgd import LocalSGD, LocalSGDConfig
from lowband.models import build_model


def method(cls, mcfg, launched: int, elastic: bool, follow: bool = True, run_dir: str = ""):
    cfg = Config(method=mcfg, train=TrainConfig(epochs=1, workers=launched),
                 elastic=ElasticConfig(on=elastic, scale_with_quorum=follow))
    ctx = Context(cfg, Communicator(0, 1, global_ranks=[0]), torch.device("cpu"), logging.getLogger("t"), run_dir, 20,
                  width=launched)
    torch.manual_seed(0)
    m = cls(mcfg, ctx)
    m.setup(build_model(ModelConfig(name="mlp", hidden=8), (1, 10), 3))
    return m


def flat(model) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()


@pytest.mark.parametrize("elastic, follow, launched, divisor", [
    (True, True, 3, 3),  # one of three launched: the sum over three, the other two zeros
    (True, False, 3, 1),  # the mean over the contributors, as before
    (False, True, 1, 1),  # a fixed world: every replica contributes, nothing changes
])
def test_diloco_divides_a_small_rounds_pseudo_gradient_by_the_workers_launched(elastic, follow, launched, divisor,
                                                                              tmp_path):
    m = method(DiLoCo, DiLoCoConfig(tau=2, outer_lr=0.7, outer_momentum=0.0), launched, elastic, follow, str(tmp_path))
    theta_global = flat(m.local_model())
    with torch.no_grad():
        for p in m.local_model().parameters():
            p.add_(0.1 * torch.randn_like(p))
    delta = theta_global - flat(m.local_model())
    m._exchange(Round(Communicator(), contributors=1), due=[0], ends=False)
    want = theta_global - 0.7 * delta / divisor  # plain outer SGD on the round's pseudo-gradient
    np.testing.assert_allclose(m.fragments[0].anchor.detach().double().numpy(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(flat(m.local_model()), want, rtol=1e-6, atol=1e-7)  # merged: θ_local <- θ_global


@pytest.mark.parametrize("elastic, follow, contributors, scale", [
    (True, True, 1, 1.0), (True, True, 2, 2.0), (True, True, 5, 3.0), (True, False, 1, 3.0), (False, True, 1, 3.0)])
def test_local_sgds_scaled_rate_counts_the_rounds_contributors(elastic, follow, contributors, scale, tmp_path):
    m = method(LocalSGD, LocalSGDConfig(tau=2), 3, elastic, follow, str(tmp_path))
    assert m.lr_scale() == 3.0  # launched with three: three workers' rate until a round says otherwise
    m._exchange(Round(Communicator(), contributors=contributors))
    assert m.lr_scale() == scale
    again = method(LocalSGD, LocalSGDConfig(tau=2), 3, elastic, follow)
    again.receive(m.shared_state(), m.handover())  # a receiver of that round trains at the same rate
    assert again.lr_scale() == scale
    saved = m.state_dict()
    restored = method(LocalSGD, LocalSGDConfig(tau=2), 3, elastic, follow)
    restored.load_state_dict(saved)  # and a resumed worker
    assert restored.lr_scale() == scale
