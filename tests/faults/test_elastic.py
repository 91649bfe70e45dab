"""Elastic jobs on real processes (training/elastic/worker.py): workers die, stall, join; the coordinator restarts.

Every job here trains local SGD, DiLoCo or SparseLoCo on a small MNIST-1D; faults are injected by round with
LOWBAND_ELASTIC_FAULT, so they land at the same place on a fast or a slow machine. What each test
checks is what a user relies on: the job finishes, the survivors hold one θ_global (their final
fingerprints agree, and no member that stayed in the quorum ever had to receive it again), no sample
is trained twice in an epoch, and the figures match a single-process simulation when nobody leaves.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import time
from itertools import pairwise

import pytest
import torch
from safetensors.torch import load_file

from lowband.distill.redis_server import EmbeddedRedis
from tests.conftest import Started, cli, start_cli

pytestmark = pytest.mark.timeout(240)
SMALL = ["--set", "data.num_samples=600", "--batch-size", "16", "--set", "method.tau=4"]
FAST_FAILURE = ["--set", "elastic.dead_after_s=1.5", "--set", "elastic.heartbeat_s=0.3",
                "--set", "elastic.timeout_s=8"]


def lowband(*args, env=None, timeout=200) -> subprocess.CompletedProcess:
    return cli(*args, timeout=timeout, env={**os.environ, **(env or {})})


def start(*args, env=None) -> Started:
    return start_cli(*args, env={**os.environ, **(env or {})})


def rounds(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "quorums.jsonl")) as f:
        return [json.loads(line) for line in f]


def wait_for_rounds(run_dir, job: Started, count: int, timeout_s: float = 60) -> None:
    """Until the running `job` has recorded `count` rounds (it must not end first)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(os.path.join(run_dir, "quorums.jsonl")) or len(rounds(run_dir)) < count:
        assert job.poll() is None and time.monotonic() < deadline, job.stdout.read()[-2000:]
        time.sleep(0.1)


def start_job(run_dir, epochs: int, rounds_done: int) -> Started:
    """A local SGD job of 2 workers, quick to notice a failure, once it has recorded `rounds_done` rounds."""
    job = start("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", str(epochs), *SMALL,
                *FAST_FAILURE, "--run-dir", str(run_dir))
    try:
        wait_for_rounds(run_dir, job, rounds_done)
    except BaseException:
        job.kill()
        raise
    return job


def final_fingerprints(run_dir) -> dict[int, str]:
    with open(os.path.join(run_dir, "train.log")) as f:
        found = re.findall(r"worker (\d+): finished with θ_global (\w+)", f.read())
    return {int(w): fp for w, fp in found}


def assert_one_model(run_dir, survivors: set[int], resent_rounds: int = 0) -> None:
    """Every survivor ends with the same θ_global, and a member that stayed needed it sent again in at most
    `resent_rounds` rounds (0: never)."""
    prints = final_fingerprints(run_dir)
    assert set(prints) == survivors and len(set(prints.values())) == 1, prints
    recs = rounds(run_dir)
    resent = [(before, now) for before, now in pairwise(recs)
              if set(before["members"]) & set(now["members"]) & set(now["receivers"])]
    assert len(resent) <= resent_rounds, resent


def assert_each_sample_at_most_once(run_dir) -> None:
    """No sample is trained into the surviving model twice within an epoch, and no part of an epoch's order
    is skipped (the audit the chaos soak runs too: a lineage lost with every worker that held it hands its
    samples out again)."""
    from lowband.training.elastic.lineage import audit_samples

    audit = audit_samples(rounds(run_dir))
    assert audit.ok, f"{audit.twice or audit.skipped} ({audit})"


def assert_one_clock(run_dir) -> None:
    """Every record of the job is timed by the job's clock (elastic.json's started_at), whichever worker
    wrote it: the rounds' and the epochs' elapsed_s never go back."""
    elapsed = [r["elapsed_s"] for r in rounds(run_dir)]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        epochs = [json.loads(line)["time"]["elapsed_s"] for line in f]
    assert elapsed == sorted(elapsed) and epochs == sorted(epochs), (elapsed, epochs)


# ---- a job nobody leaves is local SGD exactly ----------------------------------------------------------

def simulate(run_dir) -> dict[str, torch.Tensor]:
    """Local SGD replayed in one process from the job's own quorum records: each member trains its slice
    of the epoch's order with its own optimizer at the rate local SGD's rules give, every round that took
    an outer step averages the contributors' models (parameters and buffers)."""
    from lowband.comm import Communicator
    from lowband.methods.base import Context
    from lowband.methods.local_sgd import LocalSGD
    from lowband.methods.outer import SyncPlan
    from lowband.models import build_for_task
    from lowband.models.flat import flat_state, load_flat
    from lowband.run.schedule import MethodSchedule
    from lowband.training.elastic.order import EpochOrder
    from lowband.training.runconfig import read_run_config
    from lowband.training.trainer import make_optimizer, task_loss, worker_data

    cfg = read_run_config(run_dir)
    plan = worker_data(cfg, cfg.train.workers)
    data, bs = plan.data, cfg.train.batch_size
    order = EpochOrder(cfg, plan, SyncPlan(cfg.method.tau).next_sync)
    ctx = Context(cfg, Communicator(0, cfg.train.workers), torch.device("cpu"), None, str(run_dir), plan.steps, data)
    schedule = MethodSchedule(cfg, LocalSGD(cfg.method, ctx))
    torch.manual_seed(cfg.train.seed)
    first = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task)
    models = {w: first if w == 0 else __import__("copy").deepcopy(first) for w in range(cfg.train.workers)}
    opts = {w: make_optimizer(cfg.optim, m.parameters()) for w, m in models.items()}
    for rec in rounds(run_dir):
        if rec["outer_step"]:  # a meeting between two outer steps hands out slices and averages nothing
            mean = torch.stack([flat_state(models[w]) for w in rec["contributors"]]).mean(0)
            for w in rec["members"]:
                load_flat(models[w], mean)
        epoch = rec["epoch"] - 1
        for w, (a, b) in rec["slices"].items():
            model, opt = models[int(w)], opts[int(w)]
            for s in range(a, b, bs):
                schedule.apply(opt, epoch + order.done(epoch, s))
                ids = order.ids(epoch)[s:min(s + bs, b)]
                loss = task_loss(model(data.x_train[ids]), data.y_train[ids])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return models[rounds(run_dir)[-1]["members"][0]].state_dict()


def test_a_job_nobody_leaves_is_local_sgd(tmp_path):
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "2", *SMALL,
                  "--run-dir", str(run))
    assert out.returncode == 0, out.stderr[-2000:]
    got, want = load_file(str(run / "model.safetensors")), simulate(run)
    for key, value in want.items():
        if value.is_floating_point():
            torch.testing.assert_close(got[key], value, atol=2e-5, rtol=1e-4, msg=key)
    assert_one_model(run, {0, 1})
    assert_each_sample_at_most_once(run)
    assert "elastic job done" in out.stderr and (run / "elastic.png").exists()


# ---- faults ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_kill_mid_inner_steps_and_mid_exchange(tmp_path):
    """Worker 1 dies training before round 3, worker 0 (the source, who writes the job's records) after
    round 5's quorum formed: the round is redone without it, the two survivors finish together."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "4", "--epochs", "3", *SMALL,
                  *FAST_FAILURE, "--run-dir", str(run),
                  env={"LOWBAND_ELASTIC_FAULT": "1:3:inner:kill,0:5:exchange:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    assert all(1 not in r["members"] for r in recs if r["round"] >= 3)
    assert any(r["round"] == 5 and r["attempt"] >= 1 and 0 not in r["members"] for r in recs)
    assert all(0 not in r["members"] for r in recs if r["round"] > 5)
    assert recs[-1]["round"] > 5 and (run / "model.safetensors").exists()
    assert_one_model(run, {2, 3})
    assert_each_sample_at_most_once(run)
    assert out.stderr.count("was killed by SIGKILL; the job goes on without it") == 2


@pytest.mark.slow
def test_a_stalled_worker_rejoins_without_corrupting_the_average(tmp_path):
    """Worker 1 stops (SIGSTOP) for longer than elastic.dead_after_s: the others go on without it; when it
    wakes, its stale pseudo-gradient is dropped and it receives θ_global before it contributes again."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "3", "--epochs", "30", *SMALL,
                  "--set", "method.fragments=2", *FAST_FAILURE, "--run-dir", str(run),
                  env={"LOWBAND_ELASTIC_FAULT": "1:3:inner:stop:4"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    gone = [r for r in recs if 1 not in r["members"]]
    assert gone, "worker 1 never left the quorum"
    back = [r for r in recs if r["round"] > gone[0]["round"] and 1 in r["members"]]
    assert back, "worker 1 never came back"
    assert 1 in back[0]["receivers"] and 1 not in back[0]["contributors"]
    assert_one_model(run, {0, 1, 2})


@pytest.mark.slow
def test_sparseloco_runs_elastic_through_a_stall_and_a_kill_mid_exchange(tmp_path):
    """SparseLoCo's error buffers are each worker's own. Worker 1 stops (SIGSTOP) past dead_after_s and
    wakes as a receiver (its buffer starts over); worker 2 dies in round 6's exchange of sparse messages,
    which is undone (the survivors' buffers with it) and met again without it. At the end the flush
    averages the buffers of the last round's contributors: one θ_global, no sample trained twice."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "sparseloco", "--workers", "3", "--epochs", "30", *SMALL,
                  "--set", "method.chunk=256", "--set", "method.outer_lr=3.0", "--set", "method.flush='fp32'",
                  *FAST_FAILURE, "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "1:3:inner:stop:4,2:6:exchange:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    gone = [r for r in recs if 1 not in r["members"]]
    back = [r for r in recs if gone and r["round"] > gone[0]["round"] and 1 in r["members"]]
    assert gone and back, "worker 1 never left the quorum, or never came back"
    assert 1 in back[0]["receivers"] and 1 not in back[0]["contributors"]
    assert any(r["round"] == 6 and r["attempt"] >= 1 and 2 not in r["members"] for r in recs)
    assert all(2 not in r["members"] for r in recs if r["round"] > 6)
    assert_one_model(run, {0, 1})
    assert_each_sample_at_most_once(run)
    with open(run / "metrics.jsonl") as f:
        losses = [json.loads(line)["val_loss"] for line in f]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses


@pytest.mark.slow
def test_when_every_holder_of_the_newest_model_leaves_the_job_goes_back_and_says_so(tmp_path):
    """Worker 1 stops before round 3; worker 0 goes on alone (rounds 3-5) and dies before round 6. The
    rounds worker 0 took alone are held by nobody left: worker 1 wakes with the θ_global of round 2 and
    the job goes on from it. The job says which rounds were lost; their samples are handed out again,
    and in the rounds that survive (`surviving_rounds`) no sample is handed out twice in an epoch."""
    from lowband.training.elastic.lineage import span, surviving_rounds

    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "2", "--epochs", "6", *SMALL,
                  *FAST_FAILURE, "--set", "train.checkpoint_every=0",  # no checkpoint stands in for the lost rounds
                  "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "1:3:inner:stop:5,0:6:inner:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    alone = [r["round"] for r in recs if r["members"] == [0] and r["round"] >= 3]
    assert alone, "worker 0 never went on alone"
    back = next(r for r in recs if r["round"] > alone[-1])
    assert back["members"] == [1] and back["version"] <= alone[-1] + 1  # an older θ_global: a lineage lost
    lost = set(alone) - {r["round"] for r in surviving_rounds(recs)}
    assert lost and min(lost) == alone[0], (alone, lost)
    said = [line for line in (run / "train.log").read_text().splitlines() if "held only by workers that left" in line]
    assert len(said) == 1 and f"round {back['round']} " in said[0] and span(sorted(lost)) in said[0], said
    assert f"{len(lost)} lost with the only workers that held them" in out.stderr, out.stderr[-2000:]
    assert_each_sample_at_most_once(run)  # in the surviving rounds
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == list(range(1, 7))


@pytest.mark.slow
def test_a_stopped_worker_that_wakes_behind_a_newer_checkpoint_goes_on_from_the_checkpoint(tmp_path):
    """As above, but worker 0 wrote a checkpoint while alone (epoch 1 ended in round 4). Worker 1 wakes
    with round 2's θ_global, finds the job's checkpoint newer and takes it, as a joiner does: the job goes
    on from the checkpoint, and only the rounds after it are lost (before the fix: from round 3 on)."""
    from lowband.training.elastic.lineage import surviving_rounds

    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "2", "--epochs", "6", *SMALL,
                  *FAST_FAILURE, "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "1:3:inner:stop:5,0:6:inner:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    alone = [r for r in recs if r["members"] == [0] and r["round"] >= 3]
    ended = [r for before, r in pairwise(recs) if r in alone and r["epoch"] > before["epoch"]]
    assert ended, "no epoch ended while worker 0 was alone: no checkpoint to go on from"
    back = next(r for r in recs if r["round"] > alone[-1]["round"])
    assert back["members"] == [1] and back["version"] == ended[-1]["version"] + 1  # the checkpoint's θ_global
    lost = {r["round"] for r in alone} - {r["round"] for r in surviving_rounds(recs)}
    assert lost == {r["round"] for r in alone if r["round"] > ended[-1]["round"]}, (lost, ended[-1])
    log = (run / "train.log").read_text()
    assert f"takes {run / 'checkpoints' / 'rank0-epoch0001.pt'} (version {ended[-1]['version']}" in log, log[-3000:]
    assert_each_sample_at_most_once(run)
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == list(range(1, 7))


@pytest.mark.slow
def test_join_adds_a_worker_to_a_running_job(tmp_path):
    run = tmp_path / "job"
    job = start_job(run, epochs=40, rounds_done=3)
    try:
        joined = lowband("join", str(run))
        assert joined.returncode == 0, joined.stderr[-2000:]
        assert job.wait(timeout=120) == 0
    finally:
        job.kill()
    recs = rounds(run)
    first = next(r for r in recs if 2 in r["members"])
    assert 2 in first["receivers"]  # it got θ_global from a member before contributing
    assert any(2 in r["contributors"] for r in recs)
    with open(run / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    numel = sum(t.numel() for t in load_file(str(run / "model.safetensors")).values() if t.is_floating_point())
    # the source's shared state: θ_global in float32 (local SGD's outer step keeps no momentum), and a header
    assert 4 * numel <= last["bytes_total"]["join"]["sent"] < 4 * numel + 65_536
    assert_one_model(run, {0, 1, 2})
    assert_one_clock(run)


@pytest.mark.slow
def test_a_worker_that_joins_during_an_exchange_waits_for_the_next_round(tmp_path):
    """Worker 0 holds round 4's exchange open until a joiner is live: the joiner is not in that round,
    receives θ_global at the next one, then contributes."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "2", "--epochs", "12", *SMALL,
                  *FAST_FAILURE, "--set", "elastic.timeout_s=90", "--run-dir", str(run),
                  env={"LOWBAND_ELASTIC_FAULT": "0:4:exchange:join:60"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    during = next(r for r in recs if r["round"] == 4)
    first = next(r for r in recs if 2 in r["members"])
    assert 2 not in during["members"] and during["attempt"] == 0  # the round it came into went on without it
    assert first["round"] > 4 and 2 in first["receivers"]
    assert any(2 in r["contributors"] for r in recs)
    assert_one_model(run, {0, 1, 2})


@pytest.mark.slow
def test_a_joiner_of_a_streaming_job_receives_every_fragment(tmp_path):
    """Streaming DiLoCo (2 fragments): a worker that joins mid-job receives θ_global of every fragment and the
    outer state with it, so it agrees with the job's members at once (never needs it sent again) and ends
    with their θ_global."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "diloco", "--workers", "2", "--epochs", "6", *SMALL,
                  "--set", "method.fragments=2", *FAST_FAILURE, "--set", "elastic.timeout_s=60", "--run-dir", str(run),
                  env={"LOWBAND_ELASTIC_FAULT": "0:6:exchange:join:60"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    first = next(r for r in recs if 2 in r["members"])
    assert 2 in first["receivers"] and any(2 in r["contributors"] for r in recs)
    assert_one_model(run, {0, 1, 2})


@pytest.mark.slow
def test_the_job_survives_a_coordinator_restart(tmp_path):
    run = tmp_path / "job"
    with EmbeddedRedis() as url:
        server_port = url.rsplit(":", 1)[1].split("/")[0]
        job = start("train", "--elastic", "--method", "diloco", "--workers", "3", "--epochs", "40", *SMALL,
                    *FAST_FAILURE, "--run-dir", str(run), "--coordinator", url)
        try:
            wait_for_rounds(run, job, 4)
            import redis

            from lowband.distill.redis_server import EmbeddedRedis as Server
            # the same coordinator come back: its port and its password (a fresh one would refuse the job)
            restarted = Server(port=int(server_port), password=redis.connection.parse_url(url)["password"])
            _restart(url, restarted)
            code = job.wait(timeout=150)
            restarted.stop()
        finally:
            job.kill()
        assert code == 0, job.stdout.read()[-3000:]
    # a restart in the middle of a round's vote lets members that read "commit" before it and members that
    # find no vote after it part ways for a round (README, Elastic jobs): the ones that parted are sent
    # θ_global again once, and no sample check (assert_each_sample_at_most_once) applies to that round
    assert_one_model(run, {0, 1, 2}, resent_rounds=1)


def _restart(url: str, server) -> None:
    """Stop the Redis at `url` (SHUTDOWN NOSAVE: empty, as a crash without persistence) and start one on its port."""
    import redis

    with contextlib.suppress(redis.ConnectionError):
        redis.Redis.from_url(url).shutdown(nosave=True)
    time.sleep(0.5)
    server.start()


def test_resume_continues_the_job_from_its_checkpoint(tmp_path):
    run = tmp_path / "job"
    first = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "1", *SMALL,
                    "--run-dir", str(run))
    assert first.returncode == 0, first.stderr[-2000:]
    before = rounds(run)
    again = lowband("train", "--resume", str(run), "--epochs", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [1, 2]
    after = rounds(run)
    assert after[:len(before) - 1] == before[:-1]  # the finishing round is met again, now with slices
    assert [r["round"] for r in after] == list(range(len(after)))
    assert_each_sample_at_most_once(run)


@pytest.mark.slow
def test_a_killed_launcher_resumes_without_training_a_sample_twice(tmp_path):
    """SIGKILL the launcher two rounds into epoch 2: the resume starts from epoch 1's checkpoint, hands the
    slices of its round out again, and the record shows each sample of an epoch once (benchmarks/
    crash_consistency.py does this at 10 moments)."""
    run = tmp_path / "job"
    job = start("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "3", *SMALL,
                *FAST_FAILURE, "--run-dir", str(run))
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or sum(r["epoch"] == 2 for r in rounds(run)) < 3:
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        job.kill()
        job.wait()
    again = lowband("train", "--resume", str(run))
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [1, 2, 3]
    assert_each_sample_at_most_once(run)
    assert [r["round"] for r in rounds(run)] == list(range(len(rounds(run))))
    assert not [n for n in os.listdir(run) if n.startswith(".rendezvous-")]
    assert_one_clock(run)  # the resumed job's clock goes on from the rounds it kept


@pytest.mark.slow
def test_an_epochs_record_is_written_once_whoever_dies(tmp_path):
    """Worker 0, the source of the round that ends epoch 1, dies holding the claim to write its record: the
    survivor takes the claim over and writes it, and the job's records read epochs 1, 2, 3, each once."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "3", *SMALL,
                  *FAST_FAILURE, "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "0:1:record:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [1, 2, 3]
    with open(run / "train.log") as f:
        assert "epoch 1's record was owed by worker 0, who left before writing it; writing it" in f.read()


@pytest.mark.slow
def test_an_epochs_record_is_written_once_when_its_writer_was_only_stopped(tmp_path):
    """Worker 0 holds the claim to write epoch 1's record and is stopped (SIGSTOP) past dead_after_s: the
    survivor takes the claim over and writes it; worker 0 wakes, finds the claim taken, and writes neither
    the record nor the checkpoint again (the suite's chaos test once read epochs 1-5, then 2 again)."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "4", *SMALL,
                  *FAST_FAILURE, "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "0:1:record:stop:4"})
    assert out.returncode == 0, out.stderr[-2000:]
    with open(run / "metrics.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [1, 2, 3, 4]
    log = (run / "train.log").read_text()
    assert "epoch 1's record was owed by worker 0, who left before writing it; writing it" in log
    assert "worker 0: epoch 1's record was written by worker 1 while this worker was away; not writing it twice" in log


@pytest.mark.slow
def test_a_rounds_line_is_written_when_its_source_dies_after_committing_it(tmp_path):
    """Worker 0, the source of round 3, dies after the round committed and before writing its line in
    quorums.jsonl (the soak's seed 0 lost round 409's line so): the next round's source, a member of
    round 3, writes it first. Every round is recorded once, in order, and the epochs' orders add up."""
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "3", *SMALL,
                  *FAST_FAILURE, "--run-dir", str(run), env={"LOWBAND_ELASTIC_FAULT": "0:3:round:kill"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = rounds(run)
    assert [r["round"] for r in recs] == list(range(len(recs)))
    assert recs[3]["members"][0] == 0 and all(r["members"] == [1] for r in recs[4:])
    assert_each_sample_at_most_once(run)


@pytest.mark.slow
def test_below_min_workers_the_job_waits_and_says_so(tmp_path):
    run = tmp_path / "job"
    job = start("train", "--elastic", "--method", "local_sgd", "--workers", "1", "--min-workers", "2",
                "--epochs", "1", *SMALL, *FAST_FAILURE, "--run-dir", str(run))
    try:
        time.sleep(8)
        assert job.poll() is None and not (run / "quorums.jsonl").exists()
        joined = lowband("join", str(run))
        assert joined.returncode == 0, joined.stderr[-2000:]
        assert job.wait(timeout=60) == 0
    finally:
        job.kill()
    with open(run / "train.log") as f:
        assert "elastic.min_workers=2" in f.read()
    assert all(len(r["members"]) == 2 for r in rounds(run))


# ---- bad input: one line, exit 2, nothing left behind --------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--method", "allreduce"], "method.name"),
    (["--method", "diloco", "--min-workers", "3", "--max-workers", "2"], "elastic.max_workers"),
    (["--method", "diloco", "--set", "method.group_size=2"], "method.group_size"),
    (["--method", "local_sgd", "--coordinator", "redis://127.0.0.1:1/0"], "unreachable"),
    (["--method", "local_sgd", "--coordinator", "http://x"], "elastic.coordinator"),
    (["--method", "local_sgd", "--set", "elastic.host='999.1.1.1'"], "elastic.host='999.1.1.1' is invalid"),
    (["--method", "local_sgd", "--set", "elastic.max_failed_rounds=0"], "elastic.max_failed_rounds=0"),
])
def test_bad_elastic_input_is_one_line(tmp_path, args, words):
    out = lowband("train", "--elastic", *args, "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_diverging_elastic_job_stops_with_one_line(tmp_path):
    run = tmp_path / "job"
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "2", *SMALL,
                  "--lr", "1000", "--run-dir", str(run))
    assert out.returncode == 4, out.stderr[-2000:]
    assert "training diverged at epoch 1" in out.stderr and "Traceback" not in out.stderr
    assert list(run.glob("diverged.rank*.txt"))


def test_join_refuses_what_it_cannot_join(tmp_path):
    out = lowband("join", str(tmp_path))
    assert out.returncode == 2 and "not an elastic job" in out.stderr
    run = tmp_path / "done"
    assert lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "1", *SMALL,
                   "--run-dir", str(run)).returncode == 0
    out = lowband("join", str(run))
    assert out.returncode == 2 and "has finished" in out.stderr and "Traceback" not in out.stderr
    before = (run / "model.safetensors").stat().st_mtime_ns, len(rounds(run))
    again = lowband("train", "--resume", str(run))  # a finished job: said, and nothing trained or rewritten
    assert again.returncode == 0 and "has finished its 1 epoch(s)" in again.stderr, again.stderr
    assert ((run / "model.safetensors").stat().st_mtime_ns, len(rounds(run))) == before
    out = lowband("join", str(run), "--host", "999.1.1.1")  # checked before anything else
    assert out.returncode == 2 and "--host='999.1.1.1' is invalid" in out.stderr and out.stderr.count("\n") == 1


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("lowband: error")]


@pytest.mark.slow
def test_a_round_that_keeps_failing_ends_the_job_with_one_line(tmp_path):
    """Worker 1's exchange fails from round 2 on, every attempt: after elastic.max_failed_rounds=2 failures
    of the same cause the job stops, exit 3, and says so once (not ~1,100 redone rounds without end)."""
    run = tmp_path / "job"
    t0 = time.monotonic()
    out = lowband("train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "50", *SMALL,
                  *FAST_FAILURE, "--set", "elastic.max_failed_rounds=2", "--run-dir", str(run),
                  env={"LOWBAND_ELASTIC_FAULT": "1:2:exchange:fail"})
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = errors(out.stderr)
    assert "round 2 failed 2 times in a row" in line and "injected failure at round N" not in line
    assert "LOWBAND_ELASTIC_FAULT: an injected failure at round 2" in line and "elastic.max_failed_rounds=2" in line
    assert time.monotonic() - t0 < 120
    with open(run / "train.log") as f:  # it gave up at its second failure (worker 0 may go on alone meanwhile)
        assert re.findall(r"worker 1: round (\d+) attempt (\d+) failed", f.read()) == [("2", "0"), ("2", "1")]


@pytest.mark.slow
def test_a_joiner_that_cannot_exchange_leaves_without_stalling_the_job(tmp_path):
    run = tmp_path / "job"
    job = start_job(run, epochs=1000, rounds_done=2)
    try:
        bad_host = lowband("join", str(run), env={"LOWBAND_ELASTIC_HOST": "999.1.1.1"}, timeout=60)
        assert bad_host.returncode == 2 and len(errors(bad_host.stderr)) == 1, bad_host.stderr
        assert "elastic.host='999.1.1.1' is invalid" in bad_host.stderr and "Traceback" not in bad_host.stderr
        t0 = time.monotonic()
        joiner = lowband("join", str(run), env={"LOWBAND_ELASTIC_FAULT": "2:0:exchange:fail"}, timeout=60)
        assert joiner.returncode == 3 and "Traceback" not in joiner.stderr, joiner.stderr[-2000:]
        (line,) = errors(joiner.stderr)
        assert "worker 2 (a joiner) could not exchange with the job's workers" in line and "it leaves" in line
        # one attempt (elastic.timeout_s=8) and its start (torch's import alone took 15 s on a loaded 2-core
        # machine); that it tried once, not again, the rounds below say
        assert time.monotonic() - t0 < 8 + 30
        wait_for_rounds(run, job, len(rounds(run)) + 5, timeout_s=10)  # the job goes on
    finally:
        job.terminate()
        job.wait(timeout=30)
    assert max(r["attempt"] for r in rounds(run)) <= 1  # the round it joined was redone once, without it
    assert all(2 not in r["members"] for r in rounds(run))
