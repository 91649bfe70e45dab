"""`--resume --allow-world-change`: a run goes on with more, then fewer workers; nothing counted is
lost, the ranks of a data-parallel method still hold one model, and the old checkpoints are kept.
(Refusals are checked without training, in tests/unit/test_reshard.py.)"""

from __future__ import annotations

import os
from itertools import pairwise

import pytest

from lowband.run.metrics import read_metrics
from lowband.training import runconfig
from tests.conftest import cli, small


def _total(record: dict) -> float:
    return sum(t["sent"] for t in record.bytes_total.values())


@pytest.mark.slow
def test_allreduce_grows_then_shrinks(tmp_path):
    run = str(tmp_path / "run")
    assert cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "1", "--run-dir", run,
               *small(tmp_path)).returncode == 0
    refused = cli("train", "--resume", run, "--workers", "3", "--epochs", "2")
    assert refused.returncode == 2 and "(and --workers, with --allow-world-change)" in refused.stderr
    grown = cli("train", "--resume", run, "--workers", "3", "--epochs", "2", "--allow-world-change")
    assert grown.returncode == 0, grown.stderr
    assert "with 3 workers instead of 2 after epoch 1" in grown.stderr
    shrunk = cli("train", "--resume", run, "--workers", "2", "--epochs", "3", "--allow-world-change")
    assert shrunk.returncode == 0, shrunk.stderr
    again = cli("train", "--resume", run, "--epochs", "4")  # the run now records 2 workers
    assert again.returncode == 0, again.stderr
    records = read_metrics(run)
    assert [r.epoch for r in records] == [1, 2, 3, 4]
    assert [len(r.train_loss_ranks) for r in records] == [2, 3, 2, 2]
    totals = [_total(r) for r in records]
    assert all(b > a for a, b in pairwise(totals))  # counters carried over, then grew
    steps = [r.steps for r in records]
    seen = [r.samples for r in records]
    per_step = [(seen[i] - (seen[i - 1] if i else 0)) / (steps[i] - (steps[i - 1] if i else 0)) for i in range(4)]
    assert per_step == [2 * 16, 3 * 16, 2 * 16, 2 * 16]  # samples: nothing dropped or counted twice
    for r in records:  # data parallel: every rank evaluates the same model
        assert len(set(r.test_acc_ranks)) == 1
    assert runconfig.read_run_config(run).train.workers == 2
    folder = os.path.join(run, "checkpoints")
    assert {"world-2", "world-3"} <= set(os.listdir(folder))
    assert "rank2-epoch0002.pt" in os.listdir(os.path.join(folder, "world-3"))  # kept, not deleted
