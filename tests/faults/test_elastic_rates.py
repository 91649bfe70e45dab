"""The churn that collapsed (issue 65): an elastic DiLoCo job of 3 workers loses two of them in round 4, so a
quorum of one trains the rest. At the outer rate chosen for three, one worker's outer steps stalled the job
at chance; with `elastic.scale_with_quorum` (the default) the outer step shrinks with the quorum and the job
goes on learning. Both settings run here on the same faults; benchmarks/quorum_rates.py measures more seeds
and epochs (BENCHMARKS.md)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.faults.test_elastic import FAST_FAILURE, lowband

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
JOB = ["train", "--elastic", "--method", "diloco", "--workers", "3", "--epochs", "12", "--lr", "0.02",
       "--set", "data.num_samples=2000", "--batch-size", "16", "--set", "method.tau=4", "--set", "method.outer_lr=0.7",
       "--set", "elastic.min_workers=1", *FAST_FAILURE]
TWO_DIE = {"LOWBAND_ELASTIC_FAULT": "1:4:inner:kill,2:4:inner:kill"}


def final(run_dir) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f][-1]


def test_a_quorum_of_one_left_by_the_churn_that_collapsed_goes_on_learning(tmp_path):
    ends = {}
    for follow in ("true", "false"):
        run = tmp_path / follow
        out = lowband(*JOB, "--set", f"elastic.scale_with_quorum={follow}", "--run-dir", str(run), env=TWO_DIE)
        assert out.returncode == 0, out.stderr[-2000:]
        ends[follow] = final(run)
    scaled, mean = ends["true"], ends["false"]
    chance = math.log(10)
    assert scaled["val_acc"] > 0.45 and scaled["val_loss"] < 0.55 * chance  # it learnt, alone for 8 of 12 epochs
    assert scaled["val_loss"] < 0.75 * mean["val_loss"]  # measured: 0.79 against 2.30 (seed 0), 1.07 against 1.83
