"""Under torchrun the run records the world size torchrun chose; resumes with another one are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lowband.run.metrics import read_metrics
from lowband.training import runconfig
from tests.conftest import ROOT, cli, small


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "lowband", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)


@pytest.mark.slow
def test_torchrun_records_its_world_and_refuses_another(tmp_path):
    run = str(tmp_path / "run")
    done = torchrun(2, "--method", "allreduce", "--epochs", "1", "--run-dir", run, *small(tmp_path))
    assert done.returncode == 0, done.stderr
    assert runconfig.read_run_config(run).train.workers == 2
    other = torchrun(3, "--resume", run)
    assert other.returncode != 0 and "the run has 2 worker(s), this resume would start 3" in other.stderr
    again = cli("train", "--resume", run, "--epochs", "2")  # lowband's launcher starts the recorded 2
    assert again.returncode == 0, again.stderr
    assert [r.epoch for r in read_metrics(run)] == [1, 2]
    grown = torchrun(3, "--resume", run, "--epochs", "3", "--allow-world-change")
    assert grown.returncode == 0, grown.stderr
    assert "with 3 workers instead of 2 after epoch 2" in grown.stderr
    assert [len(r.train_loss_ranks) for r in read_metrics(run)] == [2, 2, 3]
    assert runconfig.read_run_config(run).train.workers == 3
