"""Tensor paths on CUDA: what a worker on a GPU hands the codecs, error feedback and checkpoints gives
what the same tensor on the CPU gives. Marked `gpu`: skipped on a machine without CUDA (CI)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lowband.comm.index_codecs import BitmaskIndex, ChunkIndex, GapsIndex
from lowband.comm.placement import here
from lowband.comm.value_codecs import ErrorFeedback, parse_codec
from lowband.run import checkpoint

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; skipped without it")]

SPECS = ["fp32", "fp16", "bf16", "int8", "int4", "int2", "int4:stochastic", "lut1", "lut2", "lut4", "topk:0.02",
         "topk:0.02+lut2", "topk:0.05+int2"]


def vector(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", SPECS)
def test_a_codec_encodes_and_decodes_a_cuda_tensor_as_the_same_cpu_one(spec):
    x, n = vector(9001), 9001
    on_cpu, on_gpu = parse_codec(spec, seed=3), parse_codec(spec, seed=3)  # stochastic ones: the same stream
    sent_cpu, sent_gpu = on_cpu.encode(x), on_gpu.encode(x.cuda())
    assert torch.equal(sent_gpu.cpu(), sent_cpu) and sent_gpu.numel() == on_cpu.payload_bytes(n)
    assert torch.equal(on_gpu.decode(sent_gpu, n).cpu(), on_cpu.decode(sent_cpu, n))


@pytest.mark.parametrize("codec", [GapsIndex(), BitmaskIndex(), ChunkIndex(40, 4096)], ids=lambda c: c.name)
def test_an_index_codec_takes_cuda_indices(codec):
    n = 9001  # three chunks of 4096, the last one 809 long: 40 positions in each, 20 apart
    idx = (torch.arange(3).unsqueeze(1) * 4096 + torch.arange(40) * 20).reshape(-1)
    sent = codec.encode(idx.cuda(), n)
    assert torch.equal(sent.cpu(), codec.encode(idx, n))
    assert torch.equal(codec.decode(sent.cuda(), n).cpu(), codec.decode(sent.cpu(), n))


@pytest.mark.parametrize("spec", ["int2", "topk:0.05+lut2"])
def test_error_feedback_with_cuda_inputs_keeps_what_the_cpu_keeps(spec):
    feedback = {"cpu": ErrorFeedback(parse_codec(spec), decay=0.9), "cuda": ErrorFeedback(parse_codec(spec), decay=0.9)}
    for step in range(3):
        sent = {}
        for device, fb in feedback.items():
            compensated = fb.compensate(vector(5000, seed=step).to(device))
            assert compensated.device.type == device
            sent[device] = fb.codec.roundtrip(compensated)
            fb.remember(compensated, sent[device])
        torch.testing.assert_close(sent["cuda"].cpu(), sent["cpu"], rtol=0, atol=1e-6)
        torch.testing.assert_close(feedback["cuda"].residual.cpu(), feedback["cpu"].residual, rtol=0, atol=1e-6)


LOAD_ON_CPU = """
import sys, torch
from lowband.run import checkpoint
assert not torch.cuda.is_available()
state = checkpoint.load_state(sys.argv[1])
from safetensors.torch import load_file
model = load_file(sys.argv[2])
assert state["model"]["w"].device.type == "cpu" and model["w"].device.type == "cpu"
assert torch.equal(state["model"]["w"], torch.arange(6.0).view(2, 3)) and torch.equal(model["w"], state["model"]["w"])
assert state["step"] == 7
print("loaded on the CPU")
"""


def test_a_checkpoint_saved_from_cuda_tensors_loads_where_there_is_no_cuda(tmp_path):
    w = torch.arange(6.0, device="cuda").view(2, 3)
    path, model = str(tmp_path / "rank0-epoch1.pt"), str(tmp_path / "model.safetensors")
    checkpoint.save_state({"model": {"w": w}, "rng": torch.get_rng_state(), "step": 7}, path)
    checkpoint.save_model({"w": w}, model)
    assert checkpoint.load_state(path)["model"]["w"].device.type == "cpu"
    done = subprocess.run([sys.executable, "-c", LOAD_ON_CPU, path, model], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert done.returncode == 0 and "loaded on the CPU" in done.stdout, done.stderr


def test_a_lone_worker_trains_on_the_gpu():
    where = here("auto", "auto", 1)
    assert where.device == "cuda" and where.device_of(0) == torch.device("cuda", 0)
    assert here("auto", "auto", where.gpus + 1).backend == "gloo"  # more workers than GPUs share them


def test_a_gloo_communicator_takes_cuda_tensors_in_every_call(tmp_path):
    """Ranks sharing one GPU talk through gloo, which does point-to-point, reduce and all-gather on host
    tensors only: the communicator stages them, so every call gives what the CPU would."""
    from tests.distributed.helpers import run_workers

    world = 3
    assert run_workers("tests.distributed.helpers:gloo_cuda_calls", [str(tmp_path)], world, str(tmp_path)) == 0
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for r, got in enumerate(ranks):
        assert got["allreduce"].tolist() == [6.0] * 3
        assert got["broadcast"].tolist() == [6.0] * 3
        assert got["gather"].tolist() == [[0.0] * 2, [1.0] * 2, [2.0] * 2]
        assert got["exchange"].tolist() == [[float(10 * p + r)] * 2 for p in range(world) if p != r]
    assert ranks[0]["reduce"].tolist() == [6.0] * 3
    assert ranks[1]["sendrecv"].tolist() == [0.0, 1.0, 2.0, 3.0]
    for r, got in enumerate(ranks):  # each peer p sent p+1 index bytes of p and p+2 values of p
        assert got["sized"].tolist() == [float(p) for p in range(world) if p != r for _ in range(2 * p + 3)]


def test_an_ensemble_of_cuda_members_runs_on_the_gpu():
    from lowband.distill.ensemble import Ensemble

    members = [torch.nn.Linear(3, 4).cuda() for _ in range(2)]
    x = torch.randn(5, 3, device="cuda")
    want = torch.stack([torch.softmax(m(x), -1) for m in members]).mean(0).log()
    torch.testing.assert_close(Ensemble(members)(x), want)
    torch.testing.assert_close(Ensemble(members, torch.tensor([0.5, 0.5]))(x), want)
