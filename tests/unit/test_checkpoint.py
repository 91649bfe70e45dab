"""Checkpoints: atomic writes, safe loading, choosing the newest epoch every rank has."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lowband.errors import UsageError
from lowband.run import checkpoint


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
    assert sorted(os.listdir(tmp_path)) == ["c.pt", "c.pt.sha256"]  # no temporary left behind


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoints_holding_code_are_refused(tmp_path):
    path = str(tmp_path / "evil.pt")
    torch.save({"x": Payload()}, path)
    with pytest.raises(UsageError, match="only unpickling code would rebuild") as refused:
        checkpoint.load_state(path)
    said = str(refused.value)
    assert "\n" not in said and "weights_only` set to `False" not in said  # no advice to unpickle it


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


def _flip(path: str, at: int, n: int = 64) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        data = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


def _truncate(path: str) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _empty(path: str) -> None:
    open(path, "wb").close()


def _no_sidecar(path: str) -> None:
    os.remove(path + checkpoint.SIDECAR)


def _directory(path: str) -> None:
    os.remove(path)
    os.mkdir(path)


def _saved_run(tmp_path, epochs=(1, 2), ranks=(0, 1)) -> str:
    run = str(tmp_path)
    for rank in ranks:
        for e in epochs:
            checkpoint.save_state({"w": torch.full((500,), float(e))}, checkpoint.rank_path(run, rank, e))
    return run


def test_intact_checkpoints_verify_against_an_independent_sha256(tmp_path):
    import hashlib

    run = _saved_run(tmp_path)
    path = checkpoint.rank_path(run, 1, 2)
    with open(path, "rb") as f, open(path + ".sha256") as g:
        assert g.read().strip() == hashlib.sha256(f.read()).hexdigest()
    assert checkpoint.resumable_epoch(run, [0, 1]) == (2, [])


@pytest.mark.parametrize("harm", [lambda p: _flip(p, 200), lambda p: _flip(p, os.path.getsize(p) - 70),
                                  _truncate, _empty, _no_sidecar, _directory],
                         ids=["flip-early", "flip-late", "truncated", "empty", "no-checksum", "directory"])
@pytest.mark.parametrize("rank", [0, 1])
def test_damaged_newest_checkpoint_falls_back_to_the_newest_intact_epoch(tmp_path, harm, rank):
    run = _saved_run(tmp_path)
    harm(checkpoint.rank_path(run, rank, 2))
    epoch, passed = checkpoint.resumable_epoch(run, [0, 1])
    assert epoch == 1
    assert len(passed) == 1 and f"rank{rank}-epoch0002.pt" in passed[0]
    assert torch.equal(checkpoint.load_state(checkpoint.rank_path(run, rank, epoch))["w"], torch.full((500,), 1.0))


def test_no_intact_epoch_means_starting_from_scratch(tmp_path):
    run = _saved_run(tmp_path)
    for e in (1, 2):
        _flip(checkpoint.rank_path(run, 0, e), 100)
    epoch, passed = checkpoint.resumable_epoch(run, [0, 1])
    assert epoch == 0 and len(passed) == 2


def test_an_epoch_only_some_ranks_have_is_not_resumed_from(tmp_path):
    run = _saved_run(tmp_path, epochs=(1,))
    checkpoint.save_state({"w": torch.ones(1)}, checkpoint.rank_path(run, 0, 2))
    assert checkpoint.resumable_epoch(run, [0, 1]) == (1, [])


def test_pruning_removes_the_checksum_files_too(tmp_path):
    run = _saved_run(tmp_path, epochs=(1, 2, 3), ranks=(0,))
    checkpoint.prune(run, 0, keep=2)
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == [
        "rank0-epoch0002.pt", "rank0-epoch0002.pt.sha256", "rank0-epoch0003.pt", "rank0-epoch0003.pt.sha256"]


def test_an_elastic_jobs_old_checkpoints_are_adopted_as_rank_0s_and_still_verify(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for e in (1, 2):  # the layout before stop 51: one file per epoch, elastic-epoch{E}.pt, and its checksum
        checkpoint.save_state({"w": torch.full((50,), float(e))}, str(folder / f"elastic-epoch{e}.pt"))
    assert checkpoint.newest_intact(str(tmp_path)) == (None, [])
    assert checkpoint.adopt_old_job_checkpoints(str(tmp_path)) == ["rank0-epoch0001.pt", "rank0-epoch0002.pt"]
    path, passed = checkpoint.newest_intact(str(tmp_path))
    assert path == checkpoint.rank_path(str(tmp_path), 0, 2) and passed == []  # the checksum is of the bytes
    assert torch.equal(checkpoint.load_state(path)["w"], torch.full((50,), 2.0))
    assert checkpoint.adopt_old_job_checkpoints(str(tmp_path)) == []  # once


def test_an_old_elastic_checkpoint_never_replaces_a_newer_rank_0_one(tmp_path):
    """elastic-epoch3.pt left beside the job's rank0-epoch0003.pt (written since): not adopted, rank 0's stays."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    checkpoint.save_state({"w": torch.full((4,), 9.0)}, checkpoint.rank_path(str(tmp_path), 0, 3))
    checkpoint.save_state({"w": torch.full((4,), 1.0)}, str(folder / "elastic-epoch3.pt"))
    assert checkpoint.adopt_old_job_checkpoints(str(tmp_path)) == []
    assert torch.equal(checkpoint.load_state(checkpoint.rank_path(str(tmp_path), 0, 3))["w"], torch.full((4,), 9.0))


def test_a_finished_run_keeps_no_temporary_and_no_checkpoint_without_its_checksum(tmp_path):
    """A writer killed mid-write left checkpoints/*.tmp-PID, or a checkpoint whose sidecar it never wrote: they
    stayed in a finished elastic job for good. tidy() removes those and keeps every sealed checkpoint."""
    import subprocess

    from lowband.run import checkpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    sealed = folder / "rank0-epoch0002.pt"
    checkpoint.save_state({"epoch": 2}, str(sealed))
    (folder / f"rank0-epoch0003.pt.tmp-{dead.pid}").write_bytes(b"half")
    (folder / "rank1-epoch0003.pt").write_bytes(b"never sealed")
    (folder / "rank1-epoch0001.pt.sha256").write_text("0" * 64 + "\n")
    (folder / f"rank0-epoch0004.pt.tmp-{os.getpid()}").write_bytes(b"a live writer's")
    gone = checkpoint.tidy(str(tmp_path))
    assert sorted(gone) == sorted([f"rank0-epoch0003.pt.tmp-{dead.pid}", "rank1-epoch0003.pt",
                                   "rank1-epoch0001.pt.sha256"])
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["rank0-epoch0002.pt", "rank0-epoch0002.pt.sha256", f"rank0-epoch0004.pt.tmp-{os.getpid()}"])
    assert checkpoint.load_state(str(sealed))["epoch"] == 2


def test_a_checkpoint_comes_into_view_sealed(tmp_path, monkeypatch):
    """A reader that sees rank{R}-epoch{E}.pt (a restart choosing its epoch, a test waiting for one) finds its
    checksum beside it: once a kill between the rename and the sidecar made a whole checkpoint look damaged,
    and a restart began from scratch (test_edl's killed student)."""
    path = str(tmp_path / "rank0-epoch0001.pt")
    seen = []
    rename = os.replace

    def watched(src, dst):
        if dst == path:
            sidecar = Path(path + checkpoint.SIDECAR)
            seen.append(sidecar.exists() and sidecar.read_text().strip() == checkpoint.file_digest(src))
        rename(src, dst)

    monkeypatch.setattr(os, "replace", watched)
    checkpoint.save_state({"w": torch.ones(3)}, path)
    assert seen == [True] and checkpoint.damage(path) is None
