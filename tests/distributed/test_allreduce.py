"""Allreduce across real gloo processes against a single-process reference on the same batches."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from tests.distributed.helpers import fixed_batches, initial_model, run_workers

STEPS, BATCH = 6, 8


def reference_trace(world: int, model_name: str) -> torch.Tensor:
    """Plain SGD in one process on the concatenation of all ranks' batches."""
    model = initial_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = fixed_batches(STEPS, BATCH * world)
    out = []
    for s in range(STEPS):
        loss = F.cross_entropy(model(xs[s]), ys[s])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(parameters_to_vector(model.parameters()).detach().clone())
    return torch.stack(out)


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_matches_single_process_and_counts_ring_bytes(tmp_path, world):
    code = run_workers("tests.distributed.helpers:allreduce_trace", [str(tmp_path), str(STEPS), str(BATCH)],
                       world, str(tmp_path))
    assert code == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in ranks:  # identical parameters on every rank after every step
        assert r["spread"] == [0.0] * STEPS
    trace = torch.load(tmp_path / "trace.pt", weights_only=True)
    torch.testing.assert_close(trace, reference_trace(world, "cnn1d"), rtol=1e-4, atol=1e-5)

    param_bytes = sum(p.numel() for p in initial_model().parameters()) * 4
    ring = 2 * (world - 1) / world * param_bytes
    for r in ranks:
        grad = r["stats"]["grad"]
        assert grad["sent"] == pytest.approx(STEPS * ring, rel=1e-12)
        assert grad["recv"] == pytest.approx(STEPS * ring, rel=1e-12)
    # the ranks started apart (seeded per rank), which the 8-byte fingerprints show; then the initial
    # broadcast is a chain from rank 0: all but the last forward, all but rank 0 receive
    fingerprints = world * (world - 1) * 8
    assert sum(r["stats"]["init"]["sent"] for r in ranks) == (world - 1) * param_bytes + fingerprints
    assert sum(r["stats"]["init"]["recv"] for r in ranks) == (world - 1) * param_bytes + fingerprints


def test_batchnorm_buffers_follow_rank_zero_and_are_counted(tmp_path):
    world, steps, model = 3, 4, "tests.distributed.helpers:bn_mlp"
    code = run_workers("tests.distributed.helpers:allreduce_trace", [str(tmp_path), str(steps), str(BATCH), model],
                       world, str(tmp_path))
    assert code == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in ranks:  # parameters and running statistics identical on every rank after every step
        assert r["spread"] == [0.0] * steps
    buffer_bytes = 2 * 16 * 4  # running_mean and running_var of BatchNorm1d(16), float32
    assert sum(r["stats"]["buffers"]["sent"] for r in ranks) == steps * (world - 1) * buffer_bytes
    assert sum(r["stats"]["buffers"]["recv"] for r in ranks) == steps * (world - 1) * buffer_bytes


def test_hierarchical_allreduce_matches_the_flat_one_and_crosses_sites_from_the_leaders_only(tmp_path):
    code = run_workers("tests.distributed.helpers:allreduce_trace",
                       [str(tmp_path), str(STEPS), str(BATCH), "cnn1d", "0,0,1,1"], 4, str(tmp_path))
    assert code == 0
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["spread"] == [0.0] * STEPS for r in ranks)
    trace = torch.load(tmp_path / "trace.pt", weights_only=True)
    torch.testing.assert_close(trace, reference_trace(4, "cnn1d"), rtol=1e-4, atol=1e-5)
    p = sum(q.numel() for q in initial_model().parameters()) * 4
    grad = [r["stats"]["grad"] for r in ranks]
    # leaders 0 and 2: a two-rank ring across the sites (p each way) and the broadcast into their site;
    # ranks 1 and 3: one send into their leader, nothing across
    assert [g["inter"] for g in grad] == [STEPS * p, 0, STEPS * p, 0]
    assert [g["sent"] for g in grad] == [2 * STEPS * p, STEPS * p, 2 * STEPS * p, STEPS * p]
