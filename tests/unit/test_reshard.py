"""Resuming with another world size: the checkpoints are re-cut by a rule checked here on files alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lowband.errors import UsageError
from lowband.run import checkpoint
from lowband.run.reshard import merge_counters, plan_sources, reshard
from lowband.training import runconfig, session
from tests.unit.test_config import build


def _state(rank: int, epoch: int) -> dict:
    return {"epoch": epoch, "samples": 1000 * (rank + 1), "model": {"w": torch.full((3,), float(rank))},
            "rng": torch.tensor([rank]),
            "comm": {"grad": {"sent": 100.0 * (rank + 1), "recv": 10.0 * (rank + 1), "calls": rank + 1},
                     **({"eval": {"sent": 7.0, "calls": 1}} if rank == 1 else {})}}


def _run(tmp_path, workers: int, epochs=(1, 2), method: str = "allreduce") -> str:
    run = str(tmp_path / "run")
    os.makedirs(run)
    runconfig.write_config(build({"method": {"name": method}, "train": {"workers": workers}}), run)
    for epoch in epochs:
        for rank in range(workers):
            checkpoint.save_state(_state(rank, epoch), checkpoint.rank_path(run, rank, epoch))
    return run


def _totals(states: list[dict]) -> dict:
    return merge_counters([s["comm"] for s in states])


@pytest.mark.parametrize("old, new", [(2, 4), (4, 2), (3, 2), (2, 3), (4, 1)])
def test_every_old_rank_is_counted_once_and_every_new_rank_has_a_source(old, new):
    sources = plan_sources(old, new)
    assert len(sources) == new
    summed = sorted(q for _, qs in sources for q in qs)
    assert summed == list(range(old))  # each old rank's counters land in exactly one new rank
    assert all(src == r % old for r, (src, _) in enumerate(sources))


def test_merge_counters_sums_field_by_field():
    merged = merge_counters([{"a": {"sent": 1.0, "calls": 1}}, {"a": {"sent": 2.5, "calls": 2}, "b": {"sent": 4.0}}])
    assert merged == {"a": {"sent": 3.5, "calls": 3}, "b": {"sent": 4.0}}


@pytest.mark.parametrize("old, new", [(2, 4), (4, 2), (3, 2)])
def test_reshard_copies_states_keeps_byte_totals_and_archives_the_old_files(tmp_path, old, new):
    run = _run(tmp_path, old)
    before = _totals([_state(q, 2) for q in range(old)])
    done = reshard(run, old, new)
    assert done.epoch == 2 and os.path.basename(done.archive) == f"world-{old}"
    assert checkpoint.ranks_saved(run) == list(range(new))
    states = [checkpoint.load_state(checkpoint.rank_path(run, r, 2)) for r in range(new)]
    for r, state in enumerate(states):
        assert torch.equal(state["model"]["w"], torch.full((3,), float(r % old)))
        assert int(state["rng"]) == r % old
    assert _totals(states) == before
    assert sum(s["samples"] for s in states) == sum(1000 * (q + 1) for q in range(old))
    kept = sorted(os.listdir(done.archive))
    assert len(kept) == 2 * 2 * old  # both epochs of every old rank, each with its checksum
    assert all(checkpoint.damage(os.path.join(done.archive, n)) is None for n in kept if n.endswith(".pt"))
    assert [n for n in os.listdir(os.path.join(run, "checkpoints")) if n.startswith(".")] == []


def test_reshard_falls_back_past_a_damaged_epoch(tmp_path):
    run = _run(tmp_path, 2)
    with open(checkpoint.rank_path(run, 1, 2), "r+b") as f:
        f.seek(40)
        f.write(b"\xff" * 8)
    done = reshard(run, 2, 3)
    assert done.epoch == 1 and len(done.passed) == 1 and "rank1-epoch0002" in done.passed[0]
    assert checkpoint.epochs_saved(run, 2) == [1]


def test_reshard_without_an_intact_epoch_moves_nothing(tmp_path):
    run = _run(tmp_path, 2, epochs=(1,))
    os.remove(checkpoint.rank_path(run, 1, 1))
    names = sorted(os.listdir(os.path.join(run, "checkpoints")))
    with pytest.raises(UsageError, match="no epoch with an intact checkpoint"):
        reshard(run, 2, 4)
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == names


def test_a_second_change_keeps_both_archives(tmp_path):
    run = _run(tmp_path, 2)
    reshard(run, 2, 4)
    checkpoint.save_state(_state(0, 3), checkpoint.rank_path(run, 0, 3))
    second = reshard(run, 4, 2)
    assert os.path.basename(second.archive) == "world-4"
    runconfig.write_config(build({"train": {"workers": 2}}), run)
    third = reshard(run, 2, 3)
    assert os.path.basename(third.archive) == "world-2-2"


def test_check_allows_a_change_only_when_asked_and_the_method_can(tmp_path):
    run = _run(tmp_path, 2)
    with pytest.raises(UsageError, match="add --allow-world-change"):
        session.check_resume_world(run, 4)
    assert session.check_resume_world(run, 4, allow_change=True) == 2


@pytest.mark.parametrize("method, says", [
    ("ec_dnn", "trains a different model on each worker"),
    ("codistill", "trains a different model on each worker"),
    ("topk", "public copies of its neighbours' models"),
])
def test_methods_whose_ranks_differ_refuse_a_world_change(tmp_path, method, says):
    run = _run(tmp_path, 4, method=method)
    with pytest.raises(UsageError, match=r"^--allow-world-change: method ") as e:
        session.check_resume_world(run, 2, allow_change=True)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_cli_refusal_is_one_line_and_leaves_the_run_untouched(tmp_path, capsys):
    from lowband.cli import main

    run = _run(tmp_path, 2, method="codistill")
    names, config = sorted(os.listdir(os.path.join(run, "checkpoints"))), Path(run, "config.toml").read_text()
    assert main(["train", "--resume", run, "--workers", "4", "--epochs", "9", "--allow-world-change"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "method codistill trains a different model on each worker" in err
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == names
    assert Path(run, "config.toml").read_text() == config  # not even the new epoch count
