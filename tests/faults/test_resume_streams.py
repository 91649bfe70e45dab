"""A resumed run cuts every record stream back to its checkpoint, so nothing is written twice."""

from __future__ import annotations

import json
import os

import pytest

from lowband.run.metrics import read_metrics
from tests.conftest import cli, small
from tests.faults.test_edl import _drop_newest_checkpoints


@pytest.mark.slow
def test_resumed_ec_dnn_has_no_duplicated_round_or_epoch(tmp_path):
    run = str(tmp_path / "run")
    args = ["--method", "ec_dnn", "--workers", "2", "--epochs", "3", "--run-dir", run,
            *small(tmp_path, "--set", "method.tau=8", "--set", "method.round_evals=50")]
    done = cli("train", *args)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(run, "rounds.jsonl")) as f:
        first = [json.loads(line) for line in f]
    assert _drop_newest_checkpoints(run, 2) == 2
    again = cli("train", "--resume", run)
    assert again.returncode == 0, again.stderr
    with open(os.path.join(run, "rounds.jsonl")) as f:
        rounds = [json.loads(line) for line in f]
    assert [r.epoch for r in read_metrics(run)] == [1, 2, 3]
    numbers = [r["round"] for r in rounds]
    assert numbers == sorted(set(numbers)) and numbers == [r["round"] for r in first]
    assert max(r["epoch"] for r in rounds) > 2  # epoch 3's rounds were written again, once
