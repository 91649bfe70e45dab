"""Where the workers train and how they talk (lowband.comm.placement), with the GPUs and the ranks on
the machine as inputs, so no GPU is needed; and the refusals of `lowband train` and `compare` before
anything starts."""

from __future__ import annotations

import json

import pytest
import torch

from lowband.cli import main
from lowband.comm import placement
from lowband.comm.placement import place
from lowband.errors import ConfigError
from lowband.run.rundir import RunDir


@pytest.mark.parametrize("gpus, ranks, backend, reason", [
    (1, 4, "gloo", "4 workers share 1 GPU: gloo"),
    (2, 4, "gloo", "4 workers share 2 GPUs: gloo"),
    (4, 4, "nccl", "4 workers on 4 GPUs, one each: nccl"),
    (8, 2, "nccl", "2 workers on 8 GPUs, one each: nccl"),
    (1, 1, "nccl", "1 worker on 1 GPU, one each: nccl"),
])
def test_auto_picks_nccl_only_when_every_local_rank_has_a_gpu_of_its_own(gpus, ranks, backend, reason):
    where = place("auto", "auto", gpus, ranks)
    assert (where.device, where.backend, where.reason) == ("cuda", backend, reason)


def test_local_rank_r_trains_on_gpu_r_modulo_the_gpus():
    assert place("cuda", "auto", 2, 4).devices == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert place("auto", "auto", 1, 3).device_of(2) == torch.device("cuda", 0)
    assert place("auto", "auto", 0, 3).devices == ["cpu"] * 3
    assert place("cpu", "auto", 4, 2).devices == ["cpu", "cpu"]


@pytest.mark.parametrize("device, gpus", [("auto", 0), ("cpu", 0), ("cpu", 4)])
def test_the_cpu_always_gets_gloo(device, gpus):
    where = place(device, "auto", gpus, 4)
    assert (where.device, where.backend, where.reason) == ("cpu", "gloo", "workers on the CPU: gloo")


def test_explicit_gloo_on_gpus_is_kept():
    where = place("cuda", "gloo", 4, 4)
    assert (where.backend, where.reason) == ("gloo", "4 workers on 4 GPUs: gloo (asked)")


def test_explicit_nccl_with_a_gpu_per_rank_is_kept():
    where = place("auto", "nccl", 2, 2)
    assert (where.device, where.backend) == ("cuda", "nccl") and where.reason.endswith("nccl (asked)")


@pytest.mark.parametrize("device, gpus, ranks, words", [
    ("auto", 0, 2, "not available here"),
    ("cpu", 4, 2, "train.device is 'cpu'"),
    ("auto", 1, 4, "4 workers on this machine would share 1 GPU"),
    ("cuda", 2, 3, "3 workers on this machine would share 2 GPUs"),
])
def test_an_nccl_that_cannot_work_is_refused_naming_the_field(device, gpus, ranks, words):
    with pytest.raises(ConfigError) as e:
        place(device, "nccl", gpus, ranks)
    message = str(e.value)
    assert e.value.field == "train.backend" and message.startswith("train.backend='nccl' is invalid: "), message
    assert words in message and "'auto'" in message and "\n" not in message, message


def test_cuda_without_a_gpu_is_refused_naming_the_device():
    for backend in ("auto", "gloo", "nccl"):
        with pytest.raises(ConfigError) as e:
            place("cuda", backend, 0, 4)
        assert e.value.field == "train.device" and "not available here" in str(e.value)


def test_the_decision_is_recorded_as_plain_data(tmp_path):
    where = place("auto", "auto", 1, 2)
    RunDir(str(tmp_path)).record_placement(where.to_dict())
    assert RunDir(str(tmp_path)).placement() == {"backend": "gloo", "devices": ["cuda:0", "cuda:0"], "gpus": 1,
                                                 "local_world": 2, "reason": "2 workers share 1 GPU: gloo"}
    assert json.loads((tmp_path / "placement.json").read_text())["backend"] == "gloo"
    assert RunDir(str(tmp_path / "none")).placement() is None


def test_here_reads_the_machine_and_the_launchers_environment(monkeypatch):
    monkeypatch.setattr(placement, "visible_gpus", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    where = placement.here("auto", "auto", placement.local_world())
    assert where.backend == "gloo" and where.device_of(placement.local_rank()) == torch.device("cuda", 1)


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    monkeypatch.setattr(placement, "visible_gpus", lambda: 0)


@pytest.mark.parametrize("setting, field", [("train.device=cuda", "train.device='cuda'"),
                                            ("train.backend=nccl", "train.backend='nccl'")])
def test_train_refuses_what_this_machine_cannot_run_before_any_worker(tmp_path, capsys, no_gpu, setting, field):
    out = tmp_path / "runs"
    code = main(["train", "--out", str(out), "--samples", "200", "--epochs", "1", "--set", setting])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"lowband: error: {field} is invalid: "), err
    assert not out.exists()


def test_compare_refuses_cuda_at_planning_and_leaves_no_folder(tmp_path, capsys, no_gpu):
    out = tmp_path / "comparisons"
    code = main(["compare", "--methods", "single,allreduce", "--out", str(out), "--epochs", "1", "-q",
                 "--samples", "200", "--set", "train.device=cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train.device='cuda'" in err, err
    assert not out.exists()


@pytest.mark.parametrize("gpus, ranks, mps, hinted", [(1, 8, False, True), (1, 8, True, False), (4, 4, False, False),
                                                      (0, 4, False, False)])
def test_workers_sharing_a_gpu_without_mps_are_told_how_to_let_their_kernels_run_together(
        monkeypatch, tmp_path, capsys, gpus, ranks, mps, hinted):
    from lowband.training import session

    monkeypatch.setattr(session, "mps_running", lambda: mps)
    where = place("auto", "auto", gpus, ranks)
    session.announce(where, str(tmp_path))
    err = capsys.readouterr().err
    assert ("nvidia-cuda-mps-control -d" in err) == hinted, err
    assert where.sharing == (gpus == 1)


def test_mps_is_running_when_its_control_pipe_exists(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not placement.mps_running()
    (tmp_path / "control").touch()
    assert placement.mps_running()
