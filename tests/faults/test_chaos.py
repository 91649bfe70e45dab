"""Faults in series on one elastic job, as a pool of cheap machines meets them (the long soak is
benchmarks/chaos.py): a worker SIGKILLed, another SIGSTOPped and woken, a joiner, a second kill, each
after the job has gone some rounds further. Nothing may be lost: the job finishes, every epoch's record
is there once and in order, no sample is handed out twice in an epoch, the final model loads, the
checkpoints verify, and no process, temporary file or traceback is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import lowband
from lowband.run import checkpoint
from tests.conftest import processes_naming, start_cli, workers_of
from tests.faults.test_elastic import assert_each_sample_at_most_once, rounds, wait_for_rounds

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
JOB = ["train", "--elastic", "--method", "diloco", "--workers", "3", "--epochs", "40", "--set", "data.num_samples=900",
       "--batch-size", "16", "--lr", "0.01", "--set", "method.tau=4", "--set", "method.outer_lr=0.7",
       "--set", "elastic.dead_after_s=1.5", "--set", "elastic.heartbeat_s=0.3", "--set", "elastic.timeout_s=8"]


def test_an_elastic_job_survives_faults_in_series_and_loses_nothing(tmp_path):
    run = tmp_path / "job"
    job = start_cli(*JOB, "--run-dir", str(run))
    joiner = None
    try:
        wait_for_rounds(run, job, 6)
        first, second, *_ = workers_of(job.pid)
        os.kill(first, signal.SIGKILL)  # gone mid-epoch
        wait_for_rounds(run, job, len(rounds(run)) + 4)
        os.kill(second, signal.SIGSTOP)  # silent for 3 s: dropped, then back as a receiver
        time.sleep(3)
        os.kill(second, signal.SIGCONT)
        wait_for_rounds(run, job, len(rounds(run)) + 4)
        joiner = start_cli("join", str(run))
        wait_for_rounds(run, job, len(rounds(run)) + 6)
        os.kill(second, signal.SIGKILL)  # the woken one, gone for good
        assert job.wait(timeout=180) == 0
        assert joiner.wait(timeout=60) == 0, joiner.stdout.read()[-2000:]
    finally:
        for proc in (job, joiner):
            if proc is not None and proc.poll() is None:
                proc.kill()
    said = job.stdout.read() + (joiner.stdout.read() if joiner else "")
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == list(range(1, 41))  # every epoch once, in order
    assert_each_sample_at_most_once(run)
    lowband.load_model(str(run))  # the final model loads
    assert all(checkpoint.damage(str(p)) is None for p in (run / "checkpoints").glob("*.pt"))
    assert "Traceback" not in said and not processes_naming(str(run))
    assert not [p for p in run.rglob("*") if ".tmp-" in p.name or p.name.startswith(".rendezvous-")]
    assert any(len(r["members"]) == 1 for r in rounds(run)) and any(len(r["receivers"]) for r in rounds(run))
