"""Tuning and the target budget with real processes: trials pruned and never chosen, a comparison killed
during tuning resumed without redoing finished trials, and a method stopped at the reference's figure."""

from __future__ import annotations

import csv
import os
import signal
import time

import pytest
import tomllib

from lowband.run.metrics import read_metrics
from tests.conftest import cli, small, start_cli

pytestmark = pytest.mark.slow


def tuning_rows(folder) -> list[dict]:
    with open(folder / "tuning.csv") as f:
        return list(csv.DictReader(f))


def test_tuning_two_fields_prunes_losing_trials_and_keeps_the_best_finished_one(tmp_path):
    p = cli("compare", "--methods", "allreduce,local_sgd:tau=4", "--workers", "2", "--epochs", "1",
            "--tune", "optim.lr=log:0.01:0.3", "--tune", "method.tau=2,8", "--tune-trials", "4", "--tune-epochs", "3",
            "--out", str(tmp_path), "-q", *small(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr
    (folder,) = tmp_path.glob("compare-*")
    rows = tuning_rows(folder)
    assert [(r["label"], r["field"]) for r in rows] == [("allreduce", "optim.lr")] * 4 + [
        ("local_sgd:tau=4", "optim.lr method.tau")] * 4  # tau only where the method has it
    assert {r["status"] for r in rows} <= {"ok", "pruned"} and any(r["status"] == "pruned" for r in rows)
    for r in rows:
        run_dir = folder / r["run_dir"]
        epochs = [e.epoch for e in read_metrics(str(run_dir))]
        if r["status"] == "pruned":  # judged before its last epoch (the process may have run on a little while
            # it was being stopped: these epochs take a fraction of a second); its folder says so
            assert int(r["epochs"]) < 3 and epochs[-1] >= int(r["epochs"]) and (run_dir / "pruned.txt").exists()
            assert f"pruned after epoch {r['epochs']}" in (run_dir / "pruned.txt").read_text()
        else:
            assert epochs == [1, 2, 3] and not (run_dir / "pruned.txt").exists()
            assert float(r["val"]) == read_metrics(str(run_dir))[-1].val_acc
    pruned = sum(r["status"] == "pruned" for r in rows)  # a pruned trial is normal operation: one line, ours
    assert p.stdout.count(" pruned after epoch ") == pruned and "interrupted" not in p.stdout + p.stderr
    for label in ("allreduce", "local_sgd:tau=4"):
        mine = [r for r in rows if r["label"] == label]
        finished = [r for r in mine if r["status"] == "ok"]
        best = max(finished, key=lambda r: float(r["val"]))  # ties: the first, as max keeps it
        assert [r["chosen"] for r in mine] == ["yes" if r is best else "no" for r in mine]
        cfg = tomllib.loads((folder / label.replace(":", "_").replace("=", "-") / "config.toml").read_text())
        values = dict(zip(best["field"].split(), best["value"].split(), strict=True))
        assert cfg["optim"]["lr"] == pytest.approx(float(values["optim.lr"]), rel=1e-5)
        if label != "allreduce":
            assert cfg["method"]["tau"] == int(values["method.tau"])
    report = (folder / "report.md").read_text()
    assert "### local_sgd:tau=4" in report and (folder / "tuning-local_sgd_tau-4.png").exists()


def test_a_comparison_killed_during_tuning_resumes_without_redoing_finished_trials(tmp_path):
    args = ["compare", "--methods", "allreduce", "--workers", "2", "--epochs", "1", "--tune", "optim.lr=0.02,0.05,0.1",
            "--tune-epochs", "4", "--tune-pruner", "none", "--out", str(tmp_path), "-q", *small(tmp_path)]
    proc = start_cli(*args)
    second = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:  # kill once the second trial finished an epoch
        second = next(iter(tmp_path.glob("compare-*/tune/allreduce/trial-001/metrics.jsonl")), None)
        if second is not None and second.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    assert proc.poll() is None and second is not None, "the comparison ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)  # its trial and that trial's workers die with it (PR_SET_PDEATHSIG)
    proc.wait()
    folder = second.parents[3]
    first = folder / "tune" / "allreduce" / "trial-000" / "metrics.jsonl"
    before = first.stat().st_mtime_ns
    time.sleep(1.0)
    again = cli("compare", "--resume", str(folder), timeout=600)
    assert again.returncode == 0, again.stderr
    assert first.stat().st_mtime_ns == before  # the finished trial was not run again
    rows = tuning_rows(folder)
    assert [(r["trial"], r["status"], r["run_dir"]) for r in rows] == [
        ("0", "ok", "tune/allreduce/trial-000"), ("1", "interrupted", "tune/allreduce/trial-001"),
        ("2", "ok", "tune/allreduce/trial-001"), ("3", "ok", "tune/allreduce/trial-003")]  # retried where it stopped
    assert rows[1]["value"] == rows[2]["value"] and sorted(r["value"] for r in rows if r["status"] == "ok") == [
        "0.02", "0.05", "0.1"]  # every value of the grid once, none dropped
    assert [r.epoch for r in read_metrics(str(folder / "tune" / "allreduce" / "trial-001"))] == [1, 2, 3, 4]


def test_the_target_budget_stops_a_method_at_the_references_figure(tmp_path):
    p = cli("compare", "--methods", "local_sgd:tau=8,allreduce", "--workers", "2", "--epochs", "3",
            "--budget", "target:2", "--out", str(tmp_path), "-q", *small(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr
    (folder,) = tmp_path.glob("compare-*")
    target = read_metrics(str(folder / "allreduce"))[-1].val_acc
    assert [r.epoch for r in read_metrics(str(folder / "allreduce"))] == [1, 2, 3]  # the reference ran first, in full
    vals = [r.val_acc for r in read_metrics(str(folder / "local_sgd_tau-8"))]
    cfg = tomllib.loads((folder / "local_sgd_tau-8" / "config.toml").read_text())
    assert cfg["train"]["epochs"] == 6 and cfg["train"]["target_accuracy"] == target  # 2x allreduce's samples
    reached = [i for i, v in enumerate(vals) if v >= target]
    if reached:  # it stopped at the first epoch that reached the target
        assert len(vals) == reached[0] + 1
    else:  # it ran to its cap, and the table says so
        assert len(vals) == 6 and "never within 2x" in p.stdout
    assert "samples to target" in p.stdout and "Compute to the target" in (folder / "report.md").read_text()
