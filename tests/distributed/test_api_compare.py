"""The Python API's compare with the command's tuning, seeds and budget: what `lowband compare` would run."""

from __future__ import annotations

import csv
import os

import pytest

import lowband

pytestmark = pytest.mark.slow


def test_compare_tunes_each_method_runs_every_seed_and_gives_the_table(tmp_path):
    result = lowband.compare(["single", "allreduce"], workers=2, epochs=1, samples=400, quiet=True, out=str(tmp_path),
                             seeds=[0, 1], tune=["optim.lr=0.05,0.1"], tune_epochs=1, budget="samples")
    assert sorted((os.path.basename(r.run_dir)) for r in result.runs) == [
        "allreduce_seed-0", "allreduce_seed-1", "single_seed-0", "single_seed-1"]
    with open(os.path.join(result.folder, "tuning.csv")) as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["label"], r["optim.lr"]) for r in rows) == [
        ("allreduce", "0.05"), ("allreduce", "0.1"), ("single", "0.05"), ("single", "0.1")]
    assert "speed-up vs allreduce" in result.table
