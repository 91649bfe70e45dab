"""EDL-Dist end to end, with real processes: teacher servers, an embedded Redis, student ranks.

Failure injection: kill -9 a teacher mid-epoch (every sample still trained on exactly once), kill -9
a student rank (all ranks restart from the latest checkpoint), Redis unreachable (exit 2).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lowband.data import Batches
from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from lowband.training.runconfig import read_run_config
from lowband.training.trainer import worker_data
from tests.conftest import Started, alive, children, cli, small, start_cli, workers_of
from tests.faults.test_processes import rank_of, wait_for


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher")
    run = str(out / "teacher")
    with pytest.MonkeyPatch.context() as mp:  # what conftest's per-test fixture sets, for this module fixture
        mp.setenv("LOWBAND_TEST_CACHE", str(tmp_path_factory.getbasetemp().parent / "lowband-cache"))
        done = _train_teacher(out, run)
    assert done.returncode == 0, done.stderr
    return run


def _train_teacher(out, run):
    return cli("train", "--method", "single", "--set", "model.channels=32", "--epochs", "2", "--run-dir", run,
               *small(out, "--samples", "2000"))


def distill(tmp_path, teacher, *extra) -> list[str]:
    return ["distill", "--teacher", teacher, "--workers", "2", *small(tmp_path, "--samples", "2000"),
            "--set", "method.log_samples=true", *extra]


def popen(args) -> Started:
    return start_cli(*args, merged=False)


def expected_ids(run: str, rank: int, epoch: int) -> list[int]:
    """The ids the student's own data order gives (what N-training would train on)."""
    cfg = read_run_config(run)
    plan = worker_data(cfg, cfg.train.workers)
    b = Batches(plan.data, plan.shards[rank], cfg.train.batch_size, plan.steps, seed=cfg.train.seed * 131 + rank)
    return torch.cat([batch.ids for batch in b.epoch(epoch)]).tolist()


def trained_ids(run: str, rank: int) -> dict[int, list[int]]:
    out = {}
    with open(os.path.join(run, f"samples.rank{rank}.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            assert r["epoch"] not in out, f"epoch {r['epoch']} recorded twice"
            out[r["epoch"]] = r["ids"]
    return out


def test_edl_gives_the_online_result_and_counts_soft_label_bytes(tmp_path, teacher):
    edl, online = str(tmp_path / "edl"), str(tmp_path / "online")
    a = cli(*distill(tmp_path, teacher, "--local-teachers", "2", "--epochs", "2", "--run-dir", edl))
    assert a.returncode == 0, a.stderr
    b = cli(*distill(tmp_path, teacher, "--mode", "online", "--epochs", "2", "--run-dir", online))
    assert b.returncode == 0, b.stderr
    ma, mb = load_file(os.path.join(edl, "model.safetensors")), load_file(os.path.join(online, "model.safetensors"))
    for k in ma:  # the same logits in the same order: the same student, wherever the teacher ran
        torch.testing.assert_close(ma[k], mb[k], rtol=1e-5, atol=1e-6)
    last = read_metrics(edl)[-1]
    steps, bs, classes, width = last.steps, 16, 10, 40
    soft = last.bytes["soft-labels"]
    # per batch: inputs out, logits back, each with an 8-byte prefix and a JSON header under 200 bytes
    assert steps * bs * width * 4 < soft["sent"] < steps * (bs * width * 4 + 200)
    assert steps * bs * classes * 4 < soft["recv"] < steps * (bs * classes * 4 + 200)
    assert "soft-labels" not in read_metrics(online)[-1].bytes
    for rank in range(2):
        ids = trained_ids(edl, rank)
        assert ids == {e: expected_ids(edl, rank, e) for e in (1, 2)}


def test_killed_teacher_mid_epoch_loses_no_sample(tmp_path, teacher):
    run = str(tmp_path / "run")
    proc = popen(distill(tmp_path, teacher, "--local-teachers", "2", "--epochs", "3", "--run-dir", run,
                         "--teacher-max-rate", "400", "--set", "method.teachers=1"))
    teachers = lambda: [p for p in children(proc.pid) if b"\0teacher\0" in Path(f"/proc/{p}/cmdline").read_bytes()]  # noqa: E731
    wait_for(lambda: len(read_metrics(run)) >= 1 or proc.poll() is not None, 120, "the first epoch")
    assert proc.poll() is None, proc.communicate()
    victims = teachers()
    assert len(victims) == 2
    os.kill(victims[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "failed (" in err and "re-sending" in err  # whichever rank held it said so (metrics are rank 0's)
    records = read_metrics(run)
    assert [r.epoch for r in records] == [1, 2, 3]
    for rank in range(2):  # every sample of every epoch trained on exactly once, in the student's order
        assert trained_ids(run, rank) == {e: expected_ids(run, rank, e) for e in (1, 2, 3)}
    assert not any(alive(p) for p in victims)


def test_killed_student_rank_restarts_all_from_the_checkpoint(tmp_path, teacher):
    run = str(tmp_path / "run")
    proc = popen(distill(tmp_path, teacher, "--local-teachers", "1", "--epochs", "4", "--run-dir", run,
                         "--teacher-max-rate", "1500", "--max-restarts", "1"))
    wait_for(lambda: all(checkpoint.epochs_saved(run, r) for r in range(2)) or proc.poll() is not None, 120,
             "every rank's first checkpoint")
    assert proc.poll() is None, proc.communicate()
    workers = workers_of(proc.pid)
    saved = checkpoint.latest_common_epoch(run, 2)
    os.kill(next(p for p in workers if rank_of(p) == 1), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "restarting all 2 worker(s) from the latest checkpoint (restart 1 of 1)" in err
    assert [r.epoch for r in read_metrics(run)] == [1, 2, 3, 4]
    with open(os.path.join(run, "train.log")) as f:
        log = f.read()
    resumed = [int(line.split("after epoch ")[1].split()[0]) for line in log.splitlines() if "resumed" in line]
    assert resumed and resumed[0] >= saved  # at most the checkpoint interval (one epoch) was lost
    assert not any(alive(p) for p in workers)


def test_unreachable_coordinator_is_one_line_and_exit_2(tmp_path, teacher):
    out = tmp_path / "runs"
    r = cli(*distill(tmp_path, teacher, "--coordinator", "redis://127.0.0.1:1/0", "--epochs", "1", "--out", str(out)))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "redis://127.0.0.1:1/0 is unreachable" in r.stderr
    assert not out.exists()  # nothing half-made


def test_edl_without_teachers_is_refused_before_anything_starts(tmp_path, teacher):
    out = tmp_path / "runs"
    r = cli(*distill(tmp_path, teacher, "--epochs", "1", "--out", str(out)))
    assert r.returncode == 2 and "--local-teachers N" in r.stderr and not out.exists()


def test_teacher_command_rejects_unreachable_coordinator(tmp_path, teacher):
    r = cli("teacher", "--checkpoint", teacher, "--coordinator", "redis://127.0.0.1:1/0")
    assert r.returncode == 2 and "unreachable" in r.stderr


def test_teacher_registers_serves_and_unregisters_on_sigterm(teacher):
    from lowband.distill.coordinator import Coordinator
    from lowband.distill.redis_server import EmbeddedRedis

    with EmbeddedRedis() as url:
        proc = popen(["teacher", "--checkpoint", teacher, "--coordinator", url, "--ttl", "30"])
        try:
            line = proc.stdout.readline()
            assert "serving 127.0.0.1:" in line and "registered in" in line, line + proc.stderr.read()
            listed = cli("coordinator", "--redis-url", url)
            assert listed.returncode == 0 and "assigned to" in listed.stdout and "cnn1d" in listed.stdout
            assert len(Coordinator(url).teachers()) == 1
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0 and "stopped after 0 requests" in out
            assert Coordinator(url).teachers() == []  # gone at once, not after its 30 s TTL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_coordinator_command_reports_an_unreachable_redis(tmp_path):
    r = cli("coordinator", "--redis-url", "redis://127.0.0.1:1/0")
    assert r.returncode == 2 and "unreachable" in r.stderr


def test_no_teacher_ever_ends_the_run_with_one_line_and_exit_3(tmp_path, teacher):
    from lowband.distill.redis_server import EmbeddedRedis

    with EmbeddedRedis() as url:  # a coordinator where no teacher ever registers
        r = cli(*distill(tmp_path, teacher, "--coordinator", url, "--epochs", "1", "--workers", "1",
                         "--set", "method.teacher_timeout_s=3", "--run-dir", str(tmp_path / "run")))
    assert r.returncode == 3, r.stderr
    assert "lowband: error: no teacher for 3 s (method.teacher_timeout_s = 3)" in r.stderr
    assert "Traceback" not in r.stderr


def _drop_newest_checkpoints(run: str, workers: int) -> int:
    """Delete every rank's newest checkpoint, as if the run had died before writing them; the epoch left."""
    newest = checkpoint.latest_common_epoch(run, workers)
    for rank in range(workers):
        os.remove(checkpoint.rank_path(run, rank, newest))
    return checkpoint.latest_common_epoch(run, workers)


@pytest.mark.slow
def test_resumed_run_writes_no_record_twice(tmp_path, teacher):
    run = str(tmp_path / "run")
    done = cli(*distill(tmp_path, teacher, "--set", "method.mode=online", "--epochs", "3", "--run-dir", run))
    assert done.returncode == 0, done.stderr
    assert _drop_newest_checkpoints(run, 2) == 2
    again = cli("train", "--resume", run)
    assert again.returncode == 0, again.stderr
    assert [r.epoch for r in read_metrics(run)] == [1, 2, 3]
    for rank in (0, 1):
        with open(os.path.join(run, f"samples.rank{rank}.jsonl")) as f:
            epochs = [json.loads(line)["epoch"] for line in f]
        assert epochs == [1, 2, 3]  # epoch 3 was trained twice, recorded once
