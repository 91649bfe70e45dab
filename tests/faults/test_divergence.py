"""A rate that blows up: every method's run ends in one line with exit code 4, no traceback on the
console (the full trace is in the run directory), its good records kept and no worker left waiting;
a comparison or a tuning sweep marks the run `diverged` and still writes its report."""

from __future__ import annotations

import csv

import pytest

from lowband.run.metrics import read_metrics
from tests.conftest import cli, small

BLOW_UP = ["--set", "optim.lr=1000"]


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_a_diverging_run_says_so_in_one_line_and_keeps_its_trace(tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run), "-q",
            *BLOW_UP, *small(tmp_path))
    assert p.returncode == 4
    line = one_line(p.stderr)
    assert line.startswith("lowband: error: training diverged at epoch 1, step ") and "lower optim.lr" in line
    traces = sorted(run.glob("diverged.rank*.txt"))
    assert traces and "Traceback" in traces[0].read_text() and str(traces[0]) in line


def test_divergence_after_good_epochs_keeps_them(tmp_path):
    # a good first epoch, then a rate that blows up: resume with more epochs is not needed, the cosine
    # schedule is constant here and the rate is raised through a second run from the first's checkpoint
    run = tmp_path / "run"
    p = cli("train", "--method", "single", "--epochs", "1", "--run-dir", str(run), "-q", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    config = (run / "config.toml").read_text().replace("lr = 0.05", "lr = 1000.0")
    (run / "config.toml").write_text(config)
    p = cli("train", "--resume", str(run), "--epochs", "3", "-q")
    errors = [line for line in p.stderr.splitlines() if line.startswith("lowband: error:")]  # beside the resume's note
    assert p.returncode == 4 and len(errors) == 1 and "diverged at epoch 2" in errors[0] and "Traceback" not in p.stderr
    assert [r.epoch for r in read_metrics(str(run))] == [1]  # the last good epoch's record stays


METHODS = ["single", "allreduce", "local_sgd:tau=4", "diloco:tau=4", "ensemble", "ec_dnn:tau=8", "dpsgd",
           "rdpsgd:p=0.5", "topk:p=0.5", "codistill:group_size=1:interval=5", "afsd:group_size=1:interval=5",
           "edl:mode=ntrain"]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", METHODS)
def test_every_method_ends_a_divergence_in_one_line(tmp_path, spec):
    name, *options = spec.split(":")
    sets = [arg for option in options for arg in ("--set", f"method.{option}")]
    p = cli("train", "--method", name, *sets, "--workers", "1" if name in ("single", "edl") else "2",
            "--epochs", "2", "--run-dir", str(tmp_path / "run"), "-q", *BLOW_UP, *small(tmp_path), timeout=100)
    assert p.returncode == 4, p.stderr
    assert "training diverged at epoch 1" in one_line(p.stderr)


@pytest.mark.slow
def test_a_comparison_marks_diverged_runs_and_writes_its_report(tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_text("methods = ['single', 'allreduce']\n[per_method.allreduce]\noptim.lr = 1000.0\n")
    p = cli("compare", "--config", str(suite), "--workers", "2", "--epochs", "1", "--out", str(tmp_path), "-q",
            *small(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert sum("training diverged" in line for line in p.stderr.splitlines()) == 1
    folder = next(tmp_path.glob("compare-*"))
    statuses = {r["label"]: r["status"] for r in csv.DictReader((folder / "summary.csv").open())}
    assert statuses == {"single": "ok", "allreduce": "diverged"}
    report = (folder / "report.md").read_text()
    assert "1 of 1 diverged" in report and "the allreduce runs diverged or failed" in report


@pytest.mark.slow
def test_every_run_diverging_still_gives_a_report_in_words(tmp_path):
    p = cli("compare", "--methods", "single,allreduce", "--workers", "2", "--epochs", "1", "--out", str(tmp_path),
            "-q", *BLOW_UP, *small(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    report = (next(tmp_path.glob("compare-*")) / "report.md").read_text()
    assert "No run finished: every run diverged or failed" in report
    assert (next(tmp_path.glob("compare-*")) / "time_link.png").stat().st_size > 0


@pytest.mark.slow
def test_a_tuning_sweep_skips_the_diverged_rate_and_marks_it(tmp_path):
    p = cli("compare", "--methods", "single", "--epochs", "1", "--tune", "optim.lr=0.05,1000", "--out", str(tmp_path),
            "-q", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    folder = next(tmp_path.glob("compare-*"))
    tuning = {r["value"]: r for r in csv.DictReader((folder / "tuning.csv").open())}
    assert tuning["1000"]["status"] == "diverged" and tuning["1000"]["chosen"] == "no"
    assert tuning["0.05"]["chosen"] == "yes"
    assert "1000 (diverged)" in (folder / "report.md").read_text()


def test_an_outer_step_that_blows_up_names_the_outer_rate(tmp_path):
    """DiLoCo at outer lr 1000 (its largest) diverges though optim.lr is sound: the line names method.outer_lr too."""
    p = cli("train", "--method", "diloco", "--set", "method.tau=2", "--set", "method.outer_lr=1000", "--workers", "2",
            "--epochs", "1", "--run-dir", str(tmp_path / "run"), "-q", *small(tmp_path))
    assert p.returncode == 4, p.stderr
    assert "method.outer_lr (1000)" in one_line(p.stderr)
