"""An elastic job whose membership never changes trains what `lowband train` of the same method trains.

Both runs start from one seed on one config; the elastic one has min_workers = max_workers = the
launched workers and no faults, so every round's quorum is all of them. The elastic worker takes its
data order, step, learning rate and records from the trainer (training/elastic/worker.py), so the two give
the same record per epoch: training loss, learning rate and evaluation of the global model to float
tolerance (the averages sum in another order), and the same bytes sent per worker. Sizes divide
evenly in most cases: 360 training samples (of 500: test and validation aside), 2 workers, batch 9, tau 4:
20 steps per epoch, 5 rounds (Streaming DiLoCo: tau 4 over 2 or 4 fragments, or tau 6 over 3, a round of 2
steps); the others have rounds of unequal length and epochs that end between two outer steps.

One byte difference is the trainer's and stays: its ranks check with an 8-byte fingerprint each that
they start alike (tag "init"; elastic workers compare theirs through the coordinator). Both run the
method's own hooks (its outer steps through a fixed quorum, or the job's), so every other figure,
BatchNorm's buffers and the final model's last outer steps included, is the same.
"""

from __future__ import annotations

import json
import os

import pytest

from lowband.comm import BOOKKEEPING_TAGS
from lowband.training.elastic.records import RANK_KEYS
from tests.conftest import cli

pytestmark = pytest.mark.timeout(240)
SIZES = ["--workers", "2", "--epochs", "2", "--seed", "3", "--set", "data.num_samples=500", "--batch-size", "9",
         "--set", "method.tau=4"]
BN = ["--model", "tests.bn_net:build"]  # a model with BatchNorm buffers
FIXED = ["--elastic", "--set", "elastic.min_workers=2", "--set", "elastic.max_workers=2"]


def train(run_dir, *args) -> list[dict]:
    out = cli("train", *SIZES, *args, "--run-dir", str(run_dir), timeout=200, env={**os.environ, "LOWBAND_QUIET": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def assert_same_training(plain: list[dict], elastic: list[dict]) -> None:
    """Loss, rate and the global model's scores per epoch."""
    assert [r["epoch"] for r in plain] == [r["epoch"] for r in elastic] == [1, 2]
    for p, e in zip(plain, elastic, strict=True):
        for key in ("train_loss", "lr", "test_acc", "test_loss", "val_acc", "val_loss"):
            if p.get(key) is not None or e.get(key) is not None:
                assert close(p[key], e[key]), (key, p["epoch"], p[key], e[key])


def assert_same_keys(plain: list[dict], elastic: list[dict]) -> None:
    """The trainer's keys, its per-rank figures null, plus the job's own three; samples and steps alike."""
    for p, e in zip(plain, elastic, strict=True):
        assert set(e) == set(p) | {"rounds", "workers", "workers_seen"}, set(e) ^ set(p)
        assert all(e[k] is None for k in RANK_KEYS) and all(p[k] is not None for k in RANK_KEYS)
        assert (e["samples"], e["steps"], e["reached_target_epoch"]) == (p["samples"], p["steps"], None)
        assert e["bytes_inter_per_worker"] == e["bytes_sent_per_worker"] > 0  # no site map: every byte crosses
        assert e["samples_per_s"] > 0 and set(e["time"]) == set(p["time"])  # the one loop times both
        for t in (p["time"], e["time"]):  # the parts of an epoch's training fit in it: a round's evaluations
            assert t["comm_s"] + t["wait_s"] <= t["epoch_train_s"] + 1e-3, t  # are hook_eval_s, never comm_s


CASES = [
    ("local_sgd", ["--set", "train.eval_batch_size=1"]),  # each round's evaluation slow: it must stay out of comm_s
    ("diloco", ["--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9"]),
    ("diloco", ["--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=2"]),
    ("diloco", ["--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=4"]),
    ("diloco", ["--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=3",
                "--set", "method.tau=6"]),  # rounds of 2 steps, 10 an epoch
    # BatchNorm's running statistics: DiLoCo averages them at the end of each full tau, local SGD with the
    # parameters; with fragments the two schedules differ from round to round
    ("local_sgd", BN),
    ("diloco", [*BN, "--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9"]),
    ("diloco", [*BN, "--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=2"]),
    ("diloco", [*BN, "--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=4"]),
    # options an elastic job refused while it ran an outer loop of its own: an inner rate's factor moving over
    # the run, heavy-ball momentum, a tau that does not divide the epoch (20 steps; fragments at steps 2, 5, 7
    # of every 7: rounds of 2, 3 and 2 steps, and epochs that end between two outer steps)
    ("diloco", [*BN, "--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.fragments=3",
                "--set", "method.tau=7", "--set", "method.inner_lr_factor=0.5", "--set", "method.inner_lr_factor_end=1.5",
                "--set", "method.outer_nesterov=false"]),
    # a tau that grows (4, then 8 from half the run) and a merge one step after each sync
    ("diloco", ["--set", "method.outer_lr=0.7", "--set", "method.outer_momentum=0.9", "--set", "method.tau_schedule=8@0.5",
                "--set", "method.overlap=1"]),
    ("local_sgd", ["--set", "method.tau_schedule=8@0.5"]),
    # SparseLoCo: sparse messages all-gathered over the round (a fixed job's all-gather too), the error buffers
    # each worker's own; with BatchNorm, two fragments and the flush of what the buffers hold at the end (in
    # fp32: a lossy dense codec sums in another way over an elastic round's group, all-gathered, docs/elastic.md)
    ("sparseloco", ["--set", "method.chunk=256", "--set", "method.outer_lr=3.0"]),
    ("sparseloco", [*BN, "--set", "method.chunk=256", "--set", "method.fragments=2", "--set", "method.flush='fp32'"]),
]


def test_every_method_that_can_run_elastic_is_compared_here():
    """A method that gains an `outer_step` runs elastic (training/elastic/job.py): it must join CASES."""
    from lowband.training.elastic.job import elastic_methods

    assert set(elastic_methods()) <= {method for method, _ in CASES}


@pytest.mark.parametrize("method, extra", CASES)
def test_a_fixed_membership_elastic_job_trains_as_lowband_train(tmp_path, method, extra):
    plain = train(tmp_path / "plain", "--method", method, *extra)
    elastic = train(tmp_path / "elastic", "--method", method, *extra, *FIXED)
    assert_same_training(plain, elastic)
    # the trainer's ranks first check with an 8-byte fingerprint each that they start alike (tag "init");
    # elastic workers compare theirs through the coordinator
    sent_plain = [r["bytes_sent_per_worker"] - r["bytes"].get("init", {}).get("sent", 0.0) for r in plain]
    sent_elastic = [r["bytes_sent_per_worker"] for r in elastic]
    assert sent_elastic[0] > 0 and sent_plain[0] == sent_elastic[0]  # epoch 1: its 5 rounds' averages, no more
    assert [r["outer_steps"] for r in elastic] == [r["outer_steps"] for r in plain]  # the method's own figure
    assert_same_keys(plain, elastic)
    # bytes per tag under the trainer's keys: per worker (`bytes`) and over the workers (`bytes_total`)
    for key in ("bytes", "bytes_total"):
        for way in ("sent", "recv"):
            mine = {t: v[way] for t, v in elastic[0][key].items() if t not in BOOKKEEPING_TAGS}
            assert mine == {t: v[way] for t, v in plain[0][key].items() if t not in BOOKKEEPING_TAGS | {"init"}}, key
    recv_plain = [r["bytes_recv_per_worker"] - r["bytes"].get("init", {}).get("recv", 0.0) for r in plain]
    assert elastic[0]["bytes_recv_per_worker"] == recv_plain[0] > 0  # the same keys, the same figures
    assert sent_plain == sent_elastic  # the final model's outer steps included: one method object, one schedule


def test_an_elastic_job_evaluates_checkpoints_and_logs_on_the_epochs_lowband_train_does(tmp_path):
    """train.eval_every, train.checkpoint_every and train.loggers mean in an elastic job what they mean in
    `lowband train` (the trainer's `due` rule; its metrics sink feeding the loggers)."""
    every = ["--epochs", "3", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
             "--set", 'train.loggers=["tests.fake_logger:FakeLogger"]']
    plain = train(tmp_path / "plain", "--method", "local_sgd", *every)
    elastic = train(tmp_path / "elastic", "--method", "local_sgd", *every, *FIXED)
    assert [r["epoch"] for r in elastic] == [1, 2, 3]
    for p, e in zip(plain, elastic, strict=True):
        evaluated = e["epoch"] != 1
        assert (e["val_acc"] is not None) == (p["val_acc"] is not None) == evaluated, (p, e)
        assert close(p["train_loss"], e["train_loss"])
        if evaluated:
            assert close(p["val_acc"], e["val_acc"]) and close(p["test_loss"], e["test_loss"])
    saved = sorted(os.listdir(tmp_path / "elastic" / "checkpoints"))  # the job's state is rank 0's, in its layout
    assert [n for n in saved if n.endswith(".pt")] == ["rank0-epoch0002.pt", "rank0-epoch0003.pt"], saved
    assert [n for n in sorted(os.listdir(tmp_path / "plain" / "checkpoints")) if n.startswith("rank0-")] == [
        n for n in saved if n.startswith("rank0-")]  # the same files, checksum sidecars included
    for run in ("plain", "elastic"):
        with open(tmp_path / run / "fake_logger.rank0.jsonl") as f:
            logged = [json.loads(line) for line in f]
        assert [r["epoch"] for r in logged] == [1, 2, 3] and {r["method"] for r in logged} == {"local_sgd"}
        assert ("accuracy/val_acc" in logged[1]["scalars"]) and "accuracy/val_acc" not in logged[0]["scalars"]
        assert (tmp_path / run / "fake_logger.rank0.closed").exists()
