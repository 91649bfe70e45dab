"""The outer step of DiLoCo and local SGD in one process: methods/outer.py's Fragment against a NumPy
Nesterov SGD and over an elastic round whose non-contributors send zeros; SyncPlan (when the outer loop
synchronises) against the rule the hooks kept before it was a pure function; a state on the wire.

The communicators are stand-ins: a world of one (the real Communicator), or `OtherRanks`, whose
allreduce adds what the other ranks of a quorum would have sent.
"""

import numpy as np
import pytest
import torch

from lowband.comm.communicator import Communicator
from lowband.comm.quorum import pack_state, unpack_state
from lowband.comm.value_codecs import parse_codec
from lowband.methods.outer import Fragment, SyncPlan, TauSchedule
from lowband.models.flat import state_tensors


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
    average = Fragment(state_tensors(model), 1.0, 0.0, parse_codec("fp32"), feedback=True)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 2.0, 1.0]]))  # this rank trained
    other_local = torch.tensor([2.0, 6.0, 5.0])  # the other contributor's θ_local
    delta_other = torch.tensor([1.0, 2.0, 3.0]) - other_local
    average.reduce_and_step(OtherRanks(3, [delta_other]), "params", contributors=2, contribute=True)
    expected = (torch.tensor([3.0, 2.0, 1.0]) + other_local) / 2
    torch.testing.assert_close(average.anchor.detach(), expected)


def test_the_elastic_diloco_step_is_one_outer_step_with_the_contributors_mean():
    """Four members, two contributors with Δ 1 and 3: θ_global moves by outer_lr · 2, not outer_lr · 1."""
    model = model_at([1.0, 2.0, 3.0, 4.0])
    frag = Fragment(list(model.parameters()), 0.5, 0.0, parse_codec("fp32"), feedback=True)
    with torch.no_grad():
        model.weight.sub_(1.0)  # this rank's Δ: all ones
    others = torch.full((4,), 3.0) + torch.zeros(4)  # one more contributor, and a member with nothing to send
    frag.reduce_and_step(OtherRanks(3, [others]), "params", contributors=2, contribute=True)
    torch.testing.assert_close(frag.anchor.detach(), torch.tensor([1.0, 2.0, 3.0, 4.0]) - 0.5 * 2.0)


@pytest.mark.parametrize("tau, fragments", [(4, 1), (4, 2), (6, 3), (7, 3), (5, 5)])
def test_the_sync_plan_is_streaming_diloco_offsets(tau, fragments):
    """Fragment p synchronises at steps s with s mod tau = round((p + 1) tau / P) mod tau; a round ends at
    every multiple of tau; next_sync is the first step after s with either."""
    plan = SyncPlan(tau, fragments)
    offsets = [round((p + 1) * tau / fragments) % tau for p in range(fragments)]
    for s in range(1, 60):
        assert plan.due(s) == [p for p in range(fragments) if s % tau == offsets[p]]
        assert plan.ends_round(s) == (s % tau == 0)
        due = [t for t in range(s + 1, s + tau + 1) if plan.due(t) or plan.ends_round(t)]
        assert plan.next_sync(s) == due[0]


def test_a_tau_schedule_syncs_where_the_hooks_did():
    """The rule the hooks kept step by step (sync once steps - last sync >= tau at steps / total), replayed,
    against the plan's pure function of the step; past the run's steps tau stays at the last phase."""
    total, spec = 100, "8@0.3/16@0.6"
    schedule, plan, last, syncs = TauSchedule(spec, 4), SyncPlan(4, 1, spec, total), 0, []
    for steps in range(1, 160):
        if steps - last >= schedule.at(steps / total):
            syncs.append(steps)
            last = steps
    assert [s for s in range(1, 160) if plan.ends_round(s)] == syncs == [s for s in range(1, 160) if plan.due(s)]
    assert syncs[:3] == [4, 8, 12] and syncs[-1] - syncs[-2] == 16


def test_a_state_travels_without_pickle_and_comes_back_whole():
    """Tensors, nested dicts with int keys (an optimizer's state), lists, numbers, None: all round-trip; the
    payload is a safetensors file (an 8-byte header length, then JSON), never a pickle."""
    anchor = torch.nn.Parameter(torch.arange(4, dtype=torch.float32))
    outer = torch.optim.SGD([anchor], lr=0.5, momentum=0.9)
    anchor.grad = torch.ones(4)
    outer.step()
    state = {"steps": 7, "lr": 0.5, "none": None, "fragments": [{"anchor": anchor.detach(), "outer": outer.state_dict()}]}
    data = pack_state(state)
    assert data[8:9] == b"{" and b"\x80\x04" not in data[:2]  # a JSON header, not a pickle protocol mark
    back = unpack_state(data)
    assert back["steps"] == 7 and back["lr"] == 0.5 and back["none"] is None
    torch.testing.assert_close(back["fragments"][0]["anchor"], anchor.detach())
    restored = torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1, momentum=0.9)
    restored.load_state_dict(back["fragments"][0]["outer"])  # int keys survive: the optimizer takes it
    torch.testing.assert_close(restored.state_dict()["state"][0]["momentum_buffer"],
                               outer.state_dict()["state"][0]["momentum_buffer"])



@pytest.mark.parametrize("contributors, other, expected", [
    (2, [1.0, 1.0, 0.0, 0.0], [1.0, 1.5, 0.0, 0.0]),  # a fixed world: the mean of both buffers
    (1, [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]),  # the other member received θ_global: this buffer alone
])
def test_sparselocos_flush_averages_the_buffers_of_the_rounds_contributors(contributors, other, expected):
    """The final model's flush: one outer step (lr 1, no momentum) on the mean of the error buffers, over the
    members that hold one (an elastic round's receiver sends zeros; dividing by both would halve the step)."""
    from lowband.comm.quorum import Round
    from lowband.methods.sparseloco import SparseLoCoConfig, flush, sparse_codec

    params = [torch.nn.Parameter(torch.zeros(4))]
    codec = sparse_codec(SparseLoCoConfig(chunk=4, density=0.25))
    frag = Fragment(params, lr=1.0, momentum=0.0, codec=codec, feedback=True)
    assert frag.feedback is not None
    frag.feedback.residual = torch.tensor([1.0, 2.0, 0.0, 0.0])
    flush(frag, Round(OtherRanks(2, [torch.tensor(other)]), contributors), parse_codec("fp32"))
    assert frag.anchor.detach().tolist() == [-e for e in expected]  # θ_global - lr · mean, from zeros
    assert frag.feedback.residual.tolist() == [0.0] * 4  # all sent: nothing is left
