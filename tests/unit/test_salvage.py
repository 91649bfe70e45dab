"""Independent models (codistillation, AFSD): a lost rank is named, the best survivor's model kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lowband.run import launch
from lowband.run.rundir import RunDir
from lowband.training import session


def _run(tmp_path, finished: dict[int, float]) -> RunDir:
    run = RunDir(str(tmp_path))
    for rank, acc in finished.items():
        with open(run.stream_path("metrics", rank=rank), "w") as f:
            f.write(json.dumps({"epoch": 1, "val_acc": 0.1}) + "\n" + json.dumps({"epoch": 2, "val_acc": acc}) + "\n")
        with open(run.model_path(rank), "w") as f:
            f.write(f"model of rank {rank}")
    return run


def test_lost_rank_0_gets_the_best_survivors_model(tmp_path, capsys):
    run = _run(tmp_path, {1: 0.5, 2: 0.8, 3: 0.7})
    assert session.salvage(run.path, 4, 137) == 137
    with open(run.model_path(0)) as f:
        assert f.read() == "model of rank 2"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lost worker(s) 0" in err[0] and "rank 2's model" in err[0] and "3 of 4" in err[0]


def test_lost_other_rank_keeps_rank_0s_model_and_fails(tmp_path, capsys):
    run = _run(tmp_path, {0: 0.5, 1: 0.9})
    assert session.salvage(run.path, 3, 0) == 1
    with open(run.model_path(0)) as f:
        assert f.read() == "model of rank 0"
    assert "lost worker(s) 2" in capsys.readouterr().err


def test_nothing_lost_changes_nothing(tmp_path, capsys):
    run = _run(tmp_path, {0: 0.5, 1: 0.9})
    assert session.salvage(run.path, 2, 0) == 0
    assert capsys.readouterr().err == ""
    assert sorted(os.listdir(run.path)) == ["metrics.jsonl", "metrics.rank1.jsonl", "model.rank1.safetensors",
                                            "model.safetensors"]


def test_keep_going_still_returns_the_lost_workers_code():
    procs = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({c})"]) for c in (0, 3, 0)]
    assert launch.supervise(procs, keep_going=True) == 3


def test_one_supervisor_two_memberships_decide_what_a_lost_worker_means():
    """launch.Watch (fixed membership) and elastic_job.ElasticWatch are the only difference between the
    two supervisors: which exits are churn (the job goes on) and which stop every worker."""
    from lowband.training.elastic.job import ElasticWatch

    fixed, keep, elastic = launch.Watch(), launch.Watch(keep_going=True), ElasticWatch(None, None)  # type: ignore[arg-type]
    running = [None, 0, None]
    assert not fixed.churn(1, [1, *running]) and not fixed.churn(-9, [-9, *running])  # fail fast
    assert keep.churn(1, [1, *running]) and keep.churn(-9, [-9, *running])
    assert not keep.churn(2, [2, *running]) and not keep.churn(1, [1, 4, None])  # every worker would meet these
    assert not keep.churn(1, [1, 1])  # nobody left to carry on
    assert elastic.churn(-9, [-9, *running]) and elastic.churn(143, [143, *running])  # a lost machine
    assert not any(elastic.churn(c, [c, *running]) for c in (1, 2, 3, 4))  # an error every worker would meet
    assert fixed.done([], [0, None]) is None and fixed.done([], [0, 0]) == 0 and keep.done([], [0, -9]) == 137


def test_a_failure_after_churn_is_blamed_on_itself_not_on_the_worker_lost_earlier(capsys):
    """With a policy that lets a killed worker go (an elastic job's), a later error exit stops the job
    with its own code and names its own worker, not the one lost before."""
    class SignalsAreChurn(launch.Watch):
        def churn(self, code, codes):
            return code < 0

    body = ["import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "import sys, time; time.sleep(1.5); sys.exit(1)",
            "import time; time.sleep(30)"]
    procs = [subprocess.Popen([sys.executable, "-c", b]) for b in body]
    assert launch.supervise(procs, watch=SignalsAreChurn()) == 1
    assert all(p.poll() is not None for p in procs)
    err = capsys.readouterr().err
    assert f"worker 0 (pid {procs[0].pid}) was killed by SIGKILL; the others carry on" in err
    assert f"worker 1 (pid {procs[1].pid}) exited with code 1" in err
