"""benchmarks/device_ladder.sh, the ladder's call on a lent GPU machine: it refuses what it cannot run in one
line, exit 2, before it installs or starts anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "device_ladder.sh")


@pytest.mark.parametrize("args", [[], ["train"], ["run", "medium"], ["run", "medium", "5"], ["run", "medium", "600"],
                                  ["run", "medium", "ten"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    done = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("usage:"), done.stderr
    assert not os.listdir(tmp_path)  # nothing started


def test_an_unknown_family_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", SCRIPT, "run", "small", "60"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path), "LADDER_FAMILIES": "diloco-0.7,diloco-07"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("LADDER_FAMILIES: 'diloco-07' is not a family of the ladder"), done.stderr
    assert not os.listdir(tmp_path)


def test_the_script_knows_the_ladders_families(monkeypatch):
    """The script's list is ladder.py's (a family added there must be added here)."""
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    sys.modules.pop("ladder", None)
    import ladder

    with open(SCRIPT) as f:
        listed = re.search(r'^FAMILIES="([^"]+)"', f.read(), re.M).group(1).split()
    assert listed == [family.name for family in ladder.FAMILIES]


def ladder_module(monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    sys.modules.pop("ladder", None)
    import ladder

    return ladder


def test_a_sizes_runs_share_one_precision_and_a_new_gpu_rung_trains_in_bf16(monkeypatch, tmp_path):
    """--precision auto keeps a size's committed precision (medium's records are fp32), gives a size without
    records bf16 on a GPU and fp32 on the CPU, and refuses a precision that would mix a size's runs."""
    ladder = ladder_module(monkeypatch)
    monkeypatch.setattr(ladder, "RESULTS", str(tmp_path))
    (tmp_path / "medium").mkdir()
    (tmp_path / "medium" / "allreduce_lr-0.004_seed-0.jsonl").write_text('{"epoch": 1, "val_bpb": 3.0}\n')
    assert ladder.precision_for("medium", "auto", "cuda") == "fp32"  # records without the key: fp32
    assert ladder.precision_for("large", "auto", "cuda") == "bf16"
    assert ladder.precision_for("large", "auto", "cpu") == ladder.precision_for("large", "auto", "") == "fp32"
    with pytest.raises(ValueError, match=r"^--precision bf16: medium's committed records trained in fp32"):
        ladder.precision_for("medium", "bf16", "cuda")
    (tmp_path / "large").mkdir()
    (tmp_path / "large" / "allreduce_lr-0.002_seed-0.jsonl").write_text('{"epoch": 1, "precision": "bf16"}\n')
    assert ladder.precision_for("large", "auto", "cpu") == "bf16"  # a size's records decide, wherever it resumes


def test_a_ladder_run_is_told_its_precision_and_its_kept_records_name_it(monkeypatch, tmp_path):
    ladder = ladder_module(monkeypatch)
    monkeypatch.setattr(ladder, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setitem(ladder.PRECISION, "large", "bf16")
    job = ladder.Job("large", "allreduce", 0.002, 0)
    assert "train.precision='bf16'" in ladder.command(job, "run")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[train]\ndevice = "cpu"\nprecision = "bf16"\n')
    (run / "metrics.jsonl").write_text('{"epoch": 1, "val_bpb": 3.0}\n')
    ladder.keep(job, str(tmp_path), 0, str(run))
    kept = (tmp_path / "results" / "large" / f"{job.name}.jsonl").read_text()
    assert '"precision": "bf16"' in kept and '"device": "cpu"' in kept


def test_an_unknown_precision_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", SCRIPT, "run", "large", "60"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path), "LADDER_PRECISION": "fp16"})
    assert done.returncode == 2 and done.stderr == "LADDER_PRECISION: 'fp16' must be auto, fp32 or bf16\n"
    assert not os.listdir(tmp_path)
