"""A resume with a world size other than the run's is refused with one line."""

from __future__ import annotations

import os

import pytest

from lowband.cli import main
from lowband.errors import UsageError
from lowband.run import checkpoint
from lowband.training import runconfig, session
from tests.unit.test_config import build


def _run(tmp_path, workers: int, ranks, epochs=(1,)) -> str:
    run = str(tmp_path / "run")
    os.makedirs(run)
    runconfig.write_config(build({"train": {"workers": workers}}), run)
    for rank in ranks:
        for epoch in epochs:
            checkpoint.save_state({"e": epoch}, checkpoint.rank_path(run, rank, epoch))
    return run


def test_same_world_size_resumes(tmp_path):
    session.check_resume_world(_run(tmp_path, 2, [0, 1]), 2)


@pytest.mark.parametrize("workers, ranks, world, says", [
    (2, [0, 1], 3, "the run has 2 worker(s), this resume would start 3"),
    (4, [0, 1, 2, 3], 2, "the run has 4 worker(s), this resume would start 2"),
    (4, [0, 1], 4, "checkpoints are of ranks [0, 1]"),  # an old torchrun run that recorded the default
    #  (two epochs kept by each: not a first checkpoint cut short)
    (2, [0, 1, 2, 3], 2, "checkpoints are of ranks [0, 1, 2, 3]"),
])
def test_other_world_size_is_refused(tmp_path, workers, ranks, world, says):
    with pytest.raises(UsageError, match=r"^--resume .*") as e:
        session.check_resume_world(_run(tmp_path, workers, ranks, epochs=(1, 2)), world)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_first_checkpoint_cut_short_resumes(tmp_path):
    """Killed while its ranks wrote their first checkpoint: rank 0 finished epoch 1's, rank 1 did not. The run
    resumes (from scratch: no epoch every rank finished), instead of being refused for good."""
    run = _run(tmp_path, 2, [0])
    assert session.check_resume_world(run, 2) == 2
    assert checkpoint.resumable_epoch(run, [0, 1])[0] == 0


def test_a_later_checkpoint_cut_short_resumes_from_the_epoch_before(tmp_path):
    run = _run(tmp_path, 2, [0, 1])
    checkpoint.save_state({"e": 2}, checkpoint.rank_path(run, 0, 2))  # rank 1 was killed writing epoch 2's
    assert session.check_resume_world(run, 2) == 2
    assert checkpoint.resumable_epoch(run, [0, 1])[0] == 1


def test_cli_resume_of_a_mismatched_run_is_exit_2_without_touching_it(tmp_path, capsys):
    run = _run(tmp_path, 4, [0, 1], epochs=(1, 2))
    before = sorted(os.listdir(run))
    assert main(["train", "--resume", run]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ranks [0, 1]" in err
    assert sorted(os.listdir(run)) == before
