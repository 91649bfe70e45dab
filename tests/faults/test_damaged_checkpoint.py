"""A bit-flipped, truncated or empty newest checkpoint: resume falls back to the newest intact epoch."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from tests.conftest import cli, small


def _flip(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(64)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(b ^ 0xFF for b in data))


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)


def _empty(path: str) -> None:
    open(path, "wb").close()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> str:
    """A finished 2-epoch run that each case copies and damages (trained once for the module)."""
    run = str(tmp_path_factory.mktemp("finished") / "run")
    done = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", run, *small(run))
    assert done.returncode == 0, done.stderr
    return run


@pytest.mark.parametrize("harm", [_flip, _truncate, _empty], ids=["flipped", "truncated", "empty"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, finished, harm):
    run = str(tmp_path / "run")
    shutil.copytree(finished, run)
    intact = checkpoint.load_state(checkpoint.rank_path(run, 1, 1))["model"]
    harm(checkpoint.rank_path(run, 1, 2))
    again = cli("train", "--resume", run)
    assert again.returncode == 0, again.stderr
    warned = [line for line in again.stderr.splitlines() if "newest intact epoch" in line]
    assert len(warned) == 1 and "rank1-epoch0002.pt" in warned[0] and "epoch 1" in warned[0]
    assert "after epoch 1" in again.stdout + again.stderr
    assert [r.epoch for r in read_metrics(run)] == [1, 2]
    assert checkpoint.resumable_epoch(run, [0, 1]) == (2, [])  # epoch 2 written again, intact
    again_1 = checkpoint.load_state(checkpoint.rank_path(run, 1, 2))["model"]
    assert all(torch.isfinite(v).all() for v in again_1.values()) and intact.keys() == again_1.keys()
