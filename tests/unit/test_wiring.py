"""Every method option that changes behaviour reaches the code that should use it.

Each test builds the method with non-default options (in one process, with a stand-in communicator
where the method needs peers) and checks what its loss, weights or schedule produced against a
reference written here in NumPy, never with the library function under test. A wiring bug (an
option read from the wrong place, a default passed instead of the option) fails these tests even
when the pure functions are right.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lowband.comm import Communicator
from lowband.config import Config, ModelConfig, TrainConfig
from lowband.data import TensorData
from lowband.data.loader import Batch
from lowband.methods.base import Context
from lowband.models import build_model
from lowband.models.flat import flat_state

C = 5


def context(mcfg, comm=None, run_dir: str = "", data=None, shard=None, steps: int = 10) -> Context:
    cfg = Config(method=mcfg, train=TrainConfig(epochs=1))
    return Context(cfg, comm or Communicator(), torch.device("cpu"), logging.getLogger("t"), run_dir, steps, data, shard)


def net(seed: int, name: str = "mlp") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name=name, hidden=16), (1, 40), C)


def inputs(n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 40, generator=g), torch.randint(0, C, (n,), generator=g)


def np_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def logits_of(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(x).double().numpy()


class PeersComm(Communicator):
    """Rank 0 of a `world`-rank group whose other ranks hold fixed tensors: all_gather returns
    [own, *peers] where a peer tensor of that shape exists, else `world` copies of its input."""

    def __init__(self, world: int, peers: list[torch.Tensor] = ()):
        super().__init__(0, world)
        self.peers = list(peers)
        self.calls: list[str] = []

    def all_gather(self, tensor, tag):
        self.calls.append(tag)
        if self.peers and self.peers[0].shape == tensor.shape and self.peers[0].dtype == tensor.dtype:
            return [tensor.clone(), *[p.clone() for p in self.peers]]
        return [tensor.clone() for _ in range(self.world)]

    def broadcast_state(self, module, src, tag, buffers_only=False):
        self.calls.append(tag)


# ---- codistillation: temperature, alpha, burn-in ---------------------------------------------------
def np_codistill(logits, peers, t) -> float:
    target = np.mean([np_softmax(p / t) for p in peers], 0)
    return float(-(target * np_log_softmax(logits / t)).sum(1).mean() * t * t)


def codistill(tmp_path, **options):
    from lowband.methods.codistill import Codistill, CodistillConfig

    mcfg = CodistillConfig(store=str(tmp_path / "store"), **options)
    method = Codistill(mcfg, context(mcfg, run_dir=str(tmp_path)))
    model = method.setup(net(0))
    method.teachers = {1: net(1).eval(), 2: net(2).eval()}
    return method, model


def test_codistill_loss_uses_its_temperature_alpha_and_burn_in(tmp_path):
    method, model = codistill(tmp_path, temperature=3.0, alpha=0.7, burn_in=5)
    x, y = inputs()
    out = model(x)
    ce = F.cross_entropy(out, y)
    method.steps_done = 4  # still burning in: no distillation
    assert method.loss(Batch(x, y, torch.arange(12)), out, ce) is ce
    method.steps_done = 5
    got = method.loss(Batch(x, y, torch.arange(12)), out, ce)
    peers = [logits_of(t, x) for t in method.teachers.values()]
    expected = ce.item() + 0.7 * np_codistill(out.detach().double().numpy(), peers, 3.0)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    assert np_codistill(out.detach().double().numpy(), peers, 1.0) != pytest.approx(np_codistill(
        out.detach().double().numpy(), peers, 3.0), rel=1e-3)  # the temperature matters here


# ---- AFSD: distance and normalisation ---------------------------------------------------------------
def np_distances(f: np.ndarray, distance: str) -> np.ndarray:
    n = len(f)
    e = np.zeros((n, n))
    for k in range(n):
        for m in range(n):
            a, b = f[k], f[m]
            if distance == "euclidean":
                e[k, m] = np.sqrt(((a - b) ** 2).sum())
            elif distance == "sqeuclidean":
                e[k, m] = ((a - b) ** 2).sum()
            else:
                e[k, m] = 1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    return e


@pytest.mark.parametrize("distance, normalize", [("euclidean", "n"), ("sqeuclidean", "n"), ("cosine", "n"),
                                                 ("euclidean", "n2")])
def test_afsd_loss_uses_its_distance_and_normalisation(tmp_path, distance, normalize):
    from lowband.methods.afsd import AFSD, AFSDConfig
    mcfg = AFSDConfig(store=str(tmp_path / "store"), distance=distance, normalize=normalize, alpha=0.3)
    method = AFSD(mcfg, context(mcfg, run_dir=str(tmp_path)))
    own = net(0)
    model = method.setup(own)
    peers = [net(1), net(2)]
    method.teachers = {j + 1: p.eval() for j, p in enumerate(peers)}  # copies of local_model()
    x, y = inputs(n=6)
    out = model(x)
    ce = F.cross_entropy(out, y)
    got = method.loss(Batch(x, y, torch.arange(6)), out, ce)
    with torch.no_grad():
        mine = np_distances(own.features(x).double().numpy(), distance)
        theirs = [np_distances(p.features(x).double().numpy(), distance) for p in peers]
    scale = 6 if normalize == "n" else 36
    term = np.mean([np.abs(mine - e).sum() / scale for e in theirs])
    assert got.item() == pytest.approx(ce.item() + 0.3 * term, rel=1e-4)


# ---- EDL-Dist: temperature, alpha, beta; the reader's options ----------------------------------------
def test_edl_loss_uses_its_temperature_and_weights():
    from lowband.methods.edl import EDL, EDLConfig

    mcfg = EDLConfig(mode="online", teacher="t", temperature=3.0, alpha=0.3, beta=0.8)
    method = EDL(mcfg, context(mcfg))
    x, y = inputs()
    out, teacher = net(0)(x), 5 * net(1)(x).detach()  # a confident teacher: T matters by a wide margin
    ce = F.cross_entropy(out, y)
    got = method.loss(Batch(x, y, torch.arange(12), teacher), out, ce)
    s, t = out.detach().double().numpy() / 3.0, teacher.double().numpy() / 3.0
    kl = (np_softmax(t) * (np_log_softmax(t) - np_log_softmax(s))).sum(1).mean()
    assert got.item() == pytest.approx(0.3 * ce.item() + 0.8 * 9.0 * kl, rel=1e-5)


def test_edl_ntrain_is_plain_cross_entropy():
    from lowband.methods.edl import EDL, EDLConfig

    mcfg = EDLConfig(mode="ntrain", alpha=0.3)
    x, y = inputs()
    out = net(0)(x)
    ce = F.cross_entropy(out, y)
    assert EDL(mcfg, context(mcfg)).loss(Batch(x, y, torch.arange(12)), out, ce) is ce


def test_edl_reader_gets_the_methods_options(monkeypatch):
    import lowband.distill.coordinator as coordinator
    import lowband.distill.reader as reader
    from lowband.methods.edl import EDL, EDLConfig

    made = {}
    monkeypatch.setattr(coordinator, "Coordinator", lambda url, lease_s: made.setdefault("coord", (url, lease_s)))
    monkeypatch.setattr(reader, "DistilReader", lambda *a, **kw: made.setdefault("reader", (a, kw)))
    mcfg = EDLConfig(teacher="t", coordinator="redis://h:1/0", ut=40, lt=3, depth=5, request_batches=7, teachers=2,
                     max_teachers=6, teacher_timeout_s=11.0, request_timeout_s=4.0, lease_s=2.5)
    data = TensorData(*inputs(8), *inputs(4), C)
    EDL(mcfg, context(mcfg, data=data))._make_reader(123.0)
    assert made["coord"] == ("redis://h:1/0", 2.5)
    args, kw = made["reader"]
    rc = args[4]
    got = (rc.ut, rc.lt, rc.depth, rc.group, rc.initial, rc.max_teachers, rc.wait_s, rc.request_timeout_s)
    assert got == (40, 3, 5, 7, 2, 6, 11.0, 4.0)
    assert args[2:4] == ((1, 40), C) and kw["student_rate"] == 123.0


# ---- EC-DNN with K = 3: the three ensembles give three different global models -----------------------
N = 60


def ec_dnn(ensemble: str, alpha: float = 0.6, beta: float = 0.4):
    from lowband.methods.ec_dnn import ECDNN, ECDNNConfig

    x_train, y_train = inputs(N, seed=3)
    data = TensorData(x_train, y_train, *inputs(10, seed=4), C)
    peers = [net(11), net(12)]
    comm = PeersComm(3, [flat_state(p) for p in peers])
    mcfg = ECDNNConfig(tau=4, p=0.5, mu=0.5, ensemble=ensemble, alpha=alpha, beta=beta, round_evals=0)
    method = ECDNN(mcfg, context(mcfg, comm=comm, data=data, shard=torch.arange(10, 50), steps=20))
    model = method.setup(net(10))
    return method, model, [model, *peers], data


def np_weights(probs: np.ndarray, y: np.ndarray, ensemble: str) -> np.ndarray:
    """(K, N) weights: the EC-DNN paper's S, R and M, straight from their definitions."""
    k, n, c = probs.shape
    if ensemble == "simple":
        return np.full((k, n), 1 / k)
    if ensemble == "regression":
        design = np.stack([probs[j].reshape(-1) for j in range(k)], 1)  # (n c, K)
        alpha = np.linalg.lstsq(design, np.eye(c)[y].reshape(-1), rcond=None)[0]
        return np.repeat(alpha[:, None], n, 1)
    w = np.zeros((k, n))
    for i in range(n):
        for j in range(k):
            w[j, i] = max(probs[j, i, y[i]] - max(probs[j, i, m] for m in range(c) if m != y[i]), 0)
        w[:, i] = w[:, i] / w[:, i].sum() if w[:, i].sum() > 0 else 1 / k
    return w


def pseudo_labels(ensemble: str):
    method, model, members, data = ec_dnn(ensemble)
    for step in range(4):  # the round ends after step 3
        method.after_step(step)
    ids = method.relabelled.nonzero().squeeze(1)
    x, y = data.x_train[ids], data.y_train[ids].numpy()
    probs = np.stack([np_softmax(logits_of(m.eval(), x)) for m in members])
    w = np_weights(probs, y, ensemble)
    np.testing.assert_allclose(method.pseudo[ids].double().numpy(), (w[:, :, None] * probs).sum(0), rtol=1e-4,
                               atol=1e-6)
    return method, w


def test_ec_dnn_ensembles_of_three_models_follow_the_chosen_weights():
    results = {e: pseudo_labels(e) for e in ("simple", "regression", "margin")}
    pseudo = {e: m.pseudo[m.relabelled] for e, (m, _) in results.items()}
    for a, b in [("simple", "regression"), ("simple", "margin"), ("regression", "margin")]:
        assert (pseudo[a] - pseudo[b]).abs().max() > 1e-3, (a, b)  # the choice changes the global model
    alpha = results["regression"][1][:, 0]
    torch.testing.assert_close(results["regression"][0].test_weights.double(), torch.tensor(alpha), rtol=1e-4,
                               atol=1e-6)  # the test-time ensemble uses the regression alpha
    for e in ("simple", "margin"):  # margin needs labels: 1/K at test time
        assert torch.equal(results[e][0].test_weights, torch.full((3,), 1 / 3))


def test_ec_dnn_loss_uses_its_alpha_and_beta():
    method, model, _, data = ec_dnn("simple", alpha=0.25, beta=0.9)
    ids = torch.arange(10, 26)
    x, y = data.x_train[ids], data.y_train[ids]
    for step in range(4):
        method.after_step(step)
    out = model.train()(x)
    ce = F.cross_entropy(out, y)
    mask = method.relabelled[ids]
    soft = -(method.pseudo[ids[mask]] * F.log_softmax(out[mask], 1)).sum(1).sum() / len(ids)
    assert method.loss(Batch(x, y, ids), out, ce).item() == pytest.approx((ce + 0.9 * soft).item(), rel=1e-5)
    for step in range(4, 6):  # two compression steps (p * tau), then the diversity term
        method.after_step(step)
    mask = method.has_target[ids]
    dist = (torch.softmax(out[mask], 1) - method.target[ids[mask]]).pow(2).sum(1).sum() / len(ids)
    assert method.loss(Batch(x, y, ids), out, ce).item() == pytest.approx((ce - 0.25 * dist).item(), rel=1e-5)


# ---- allreduce: linear learning-rate scaling and its warm-up ----------------------------------------
@pytest.mark.parametrize("world", [1, 4])
def test_allreduce_scales_the_lr_by_the_world_and_warms_up(world):
    from lowband.methods.allreduce import Allreduce, AllreduceConfig

    mcfg = AllreduceConfig(warmup_epochs=3.5)
    method = Allreduce(mcfg, context(mcfg, comm=PeersComm(world)))
    assert method.lr_scale() == world
    assert method.default_warmup_epochs() == (3.5 if world > 1 else 0.0)


# ---- gossip: the topology's mixing weights reach the method ------------------------------------------
def test_dpsgd_mixes_with_the_torus_weights():
    from lowband.methods.gossip import DPSGD, DPSGDConfig

    class Rank4(PeersComm):
        def __init__(self):
            super().__init__(9)
            self.rank = 4  # the centre of a 3 x 3 torus

    mcfg = DPSGDConfig(topology="torus")
    method = DPSGD(mcfg, context(mcfg, comm=Rank4()))
    method.setup(net(0))
    assert method.peers == [1, 3, 5, 7]  # up, left, right, down
    assert method.w_self == pytest.approx(1 / 5) and method.w_peer == pytest.approx({1: 0.2, 3: 0.2, 5: 0.2, 7: 0.2})
