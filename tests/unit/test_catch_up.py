"""JobFiles.catch_up: a worker that arrives behind an elastic job takes the job's newest checkpoint only when
it holds a newer θ_global than its own, reads each checkpoint once, and goes on without one it cannot read.
No processes: the quorum and the method are fakes that record what they were told."""

from __future__ import annotations

import logging
import os

import torch

from lowband.run import checkpoint
from lowband.run.rundir import RunDir
from lowband.training.elastic.files import JobFiles
from lowband.training.elastic.records import checkpoint_state


class FakeQuorum:
    def __init__(self, version: int):
        self.version = version
        self.resumed: list[tuple] = []

    def resume_at(self, version: int, round_no: int, from_checkpoint: bool) -> None:
        self.resumed.append((version, round_no, from_checkpoint))
        self.version = version


class FakePlan:
    def __init__(self, quorum: FakeQuorum):
        self.quorum = quorum

    def resume_at(self, epoch: int) -> None:  # the epoch joins the quorum's last resume, as (version, round, epoch, ...)
        version, round_no, from_checkpoint = self.quorum.resumed[-1]
        self.quorum.resumed[-1] = (version, round_no, epoch, from_checkpoint)


class FakeMethod:
    def __init__(self):
        self.received: list[torch.Tensor] = []

    def receive(self, shared: dict, extra: dict) -> None:
        self.received.append(shared["theta"])


def worker(tmp_path, version: int) -> JobFiles:
    files = JobFiles()
    files.id, files.log, files.seen_checkpoint = 1, logging.getLogger("test"), None
    files.run_dir = RunDir(str(tmp_path))
    files.outer = FakeQuorum(version)  # type: ignore[assignment]
    files.data = FakePlan(files.outer)  # type: ignore[assignment, arg-type]
    files.state = FakeMethod()  # type: ignore[assignment]
    return files


def save(tmp_path, epoch: int, version: int, value: float) -> str:
    os.makedirs(RunDir(str(tmp_path)).checkpoint_dir, exist_ok=True)
    path = checkpoint.rank_path(str(tmp_path), 0, epoch)
    checkpoint.save_state(checkpoint_state(version, version, epoch, {"theta": torch.full((3,), value)}, {}, {}), path)
    return path


def test_a_newer_checkpoint_is_taken_as_a_joiner_takes_it(tmp_path):
    save(tmp_path, 1, version=5, value=7.0)
    files = worker(tmp_path, version=3)
    files.catch_up()
    assert files.outer.resumed == [(5, 5, 1, True)]  # type: ignore[union-attr]
    assert torch.equal(files.state.received[0], torch.full((3,), 7.0))  # type: ignore[attr-defined]


def test_a_checkpoint_no_newer_than_the_worker_is_not_taken(tmp_path):
    save(tmp_path, 1, version=5, value=7.0)
    for version in (5, 8):
        files = worker(tmp_path, version=version)
        files.catch_up()
        assert files.outer.resumed == [] and files.state.received == []  # type: ignore[union-attr,attr-defined]


def test_each_checkpoint_is_read_once_and_a_newer_one_again(tmp_path, monkeypatch):
    save(tmp_path, 1, version=5, value=7.0)
    files = worker(tmp_path, version=3)
    reads = []
    load = checkpoint.load_state
    monkeypatch.setattr(checkpoint, "load_state", lambda path: reads.append(path) or load(path))
    files.catch_up()
    files.catch_up()
    assert len(reads) == 1
    files.outer.version = 2  # type: ignore[union-attr]  # it fell behind again; a newer checkpoint came
    save(tmp_path, 2, version=9, value=1.0)
    files.catch_up()
    assert len(reads) == 2 and files.outer.resumed[-1] == (9, 9, 2, True)  # type: ignore[union-attr]


def test_no_checkpoint_or_an_unreadable_one_leaves_the_worker_as_it_was(tmp_path, monkeypatch, caplog):
    files = worker(tmp_path, version=3)
    files.catch_up()  # no checkpoint folder at all
    path = save(tmp_path, 1, version=5, value=7.0)

    def pruned(p):
        raise FileNotFoundError(p)

    monkeypatch.setattr(checkpoint, "load_state", pruned)
    with caplog.at_level(logging.WARNING):
        files.catch_up()
    assert files.outer.resumed == [] and files.state.received == []  # type: ignore[union-attr,attr-defined]
    assert f"could not read {path} to catch up" in caplog.text
