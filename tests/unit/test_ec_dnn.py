"""EC-DNN's round logic in one process (K = 1: the ensemble is the model itself)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from lowband.comm import Communicator
from lowband.config import Config, ModelConfig, TrainConfig
from lowband.data import Batch, TensorData
from lowband.methods.base import Context
from lowband.methods.ec_dnn import ECDNN, ECDNNConfig
from lowband.models import build_model
from lowband.models.flat import flat_state

N, C = 60, 4


def make(tau=4, p=0.5, mu=0.5, alpha=0.6, beta=0.4):
    gen = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(N, 1, 40, generator=gen), torch.randint(0, C, (N,), generator=gen),
                      torch.randn(10, 1, 40, generator=gen), torch.randint(0, C, (10,), generator=gen), C)
    mcfg = ECDNNConfig(tau=tau, p=p, mu=mu, alpha=alpha, beta=beta, round_evals=0)
    cfg = Config(method=mcfg, train=TrainConfig(epochs=1))
    shard = torch.arange(10, 50)
    ctx = Context(cfg, Communicator(), torch.device("cpu"), logging.getLogger("t"), "", 20, data, shard)
    torch.manual_seed(0)
    method = ECDNN(mcfg, ctx)
    model = method.setup(build_model(ModelConfig(name="mlp", hidden=16), (1, 40), C))
    return method, model, data, shard


def batch(data, ids):
    return Batch(data.x_train[ids], data.y_train[ids], ids)


def test_round_end_relabels_mu_of_own_data_and_keeps_own_weights():
    method, model, data, shard = make(tau=4, mu=0.5)
    before = flat_state(model).clone()
    for step in range(4):
        method.after_step(step)
    assert torch.equal(flat_state(model), before)  # compression starts from the worker's own weights
    ids = method.relabelled.nonzero().squeeze(1)
    assert len(ids) == 20 and set(ids.tolist()) <= set(shard.tolist())
    with torch.no_grad():
        expected = torch.softmax(model.eval()(data.x_train[ids]), 1)
    torch.testing.assert_close(method.pseudo[ids], expected)
    assert method.compress_left == 2  # p * tau


def test_compression_loss_uses_the_stored_pseudo_labels():
    method, model, data, shard = make(tau=4, beta=0.4)
    for step in range(4):
        method.after_step(step)
    method.pseudo[method.relabelled] = torch.softmax(torch.randn(int(method.relabelled.sum()), C), 1)
    ids = shard[:16]
    b = batch(data, ids)
    x, y = b.x, b.y
    out = model(x)
    ce = F.cross_entropy(out, y)
    mask = method.relabelled[ids]
    target = method.pseudo[ids[mask]]
    expected = ce + 0.4 * (-(target * F.log_softmax(out[mask], 1)).sum(1)).sum() / len(ids)
    torch.testing.assert_close(method.loss(batch(data, ids), out, ce), expected)
    assert 0 < mask.sum() < len(ids)  # some samples of the batch were relabelled, some not


def test_after_compression_the_diversity_term_targets_the_compressed_models_mean_output():
    method, model, data, shard = make(tau=4, p=0.25, alpha=0.6)
    for step in range(5):  # round ends after step 3; one compression step (p * tau = 1)
        method.after_step(step)
    assert method.compress_left == 0 and method.has_target.sum() == method.relabelled.sum()
    ids = shard[:16]
    b = batch(data, ids)
    x, y = b.x, b.y
    out = model.train()(x)
    ce = F.cross_entropy(out, y)
    mask = method.has_target[ids]
    dist = (torch.softmax(out[mask], 1) - method.target[ids[mask]]).pow(2).sum(1)
    torch.testing.assert_close(method.loss(batch(data, ids), out, ce), ce - 0.6 * dist.sum() / len(ids))


def test_state_round_trips_for_resume():
    method, model, data, _ = make()
    for step in range(4):
        method.after_step(step)
    other, _, _, _ = make()
    other.load_state_dict(method.state_dict())
    assert torch.equal(other.pseudo, method.pseudo) and other.compress_left == method.compress_left


@pytest.mark.parametrize("field, value", [("tau", 0), ("alpha", -0.1), ("beta", -1.0), ("p", 0.0), ("p", 1.5),
                                          ("mu", 0.0), ("mu", 1.01)])
def test_invalid_knobs_name_the_field(field, value):
    from lowband.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        ECDNNConfig(**{field: value})
    assert e.value.field == f"method.{field}"
