"""A DiLoCo worker killed mid-run: every rank restarts from the last checkpoint with θ_global, the
outer optimizer's momentum and the error-feedback residuals restored, and the run ends with the
same model as one that was never interrupted."""

from __future__ import annotations

import os
import signal

import torch
from safetensors.torch import load_file

from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from tests.conftest import alive, cli, small, start_cli, workers_of
from tests.faults.test_processes import rank_of, wait_for

EPOCHS = 6


def args(run: str) -> list[str]:
    return ["train", "--method", "diloco", "--workers", "2", "--epochs", str(EPOCHS), "--run-dir", run,
            *small(os.path.dirname(run), "--samples", "3000", "--batch-size", "8", "--set", "method.tau=7",
                   "--set", "method.codec='topk:0.1+int4'", "--set", "optim.schedule='constant'")]


def test_killed_worker_restarts_from_the_checkpoint_and_ends_as_if_never_killed(tmp_path):
    straight = str(tmp_path / "straight")
    assert cli(*args(straight)).returncode == 0
    run = str(tmp_path / "killed")
    proc = start_cli(*args(run), "--set", "train.max_restarts=1", merged=False)
    wait_for(lambda: all(checkpoint.epochs_saved(run, r) for r in range(2)) or proc.poll() is not None, 120,
             "every rank's first checkpoint")
    assert proc.poll() is None, "the run ended before a worker could be killed; make it longer"
    workers = workers_of(proc.pid)
    os.kill(next(p for p in workers if rank_of(p) == 1), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "restarting all 2 worker(s) from the latest checkpoint" in err
    assert [r.epoch for r in read_metrics(run)] == list(range(1, EPOCHS + 1))
    a, b = load_file(os.path.join(straight, "model.safetensors")), load_file(os.path.join(run, "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
    assert not any(alive(p) for p in workers)
