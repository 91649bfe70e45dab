"""Checkpoints: atomic writes, safe loading, choosing the newest epoch every rank has."""

from __future__ import annotations

import os

import pytest
import torch

from lowband import checkpoint
from lowband.errors import UsageError


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "c.pt")
    checkpoint.save_state({"w": torch.ones(3)}, path)

    def partial_write(obj, f):
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", partial_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_state({"w": torch.zeros(3)}, path)
    assert torch.equal(checkpoint.load_state(path)["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["c.pt"]  # no temporary left behind


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoints_holding_code_are_refused(tmp_path):
    path = str(tmp_path / "evil.pt")
    torch.save({"x": Payload()}, path)
    with pytest.raises(UsageError, match="unreadable"):
        checkpoint.load_state(path)


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = str(tmp_path / "t.pt")
    checkpoint.save_state({"w": torch.ones(1000)}, path)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(UsageError, match="t.pt is unreadable"):
        checkpoint.load_state(path)


def test_latest_common_epoch_and_pruning(tmp_path):
    run = str(tmp_path)
    for rank, epochs in ((0, [1, 2, 3]), (1, [1, 2])):
        for e in epochs:
            checkpoint.save_state({"e": e}, checkpoint.rank_path(run, rank, e))
    assert checkpoint.latest_common_epoch(run, 2) == 2
    assert checkpoint.latest_common_epoch(run, 3) == 0
    checkpoint.prune(run, 0, keep=2)
    assert checkpoint.epochs_saved(run, 0) == [2, 3]


def test_final_model_is_safetensors(tmp_path):
    from safetensors.torch import load_file

    model = torch.nn.Linear(3, 2)
    checkpoint.save_model(model.state_dict(), str(tmp_path / "m.safetensors"))
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert torch.equal(loaded["weight"], model.weight.detach())
