"""What an elastic job refuses before anything starts: one line naming the field, exit 2, no run directory."""

from __future__ import annotations

import pytest

from lowband.cli import main


@pytest.mark.parametrize("args, field, fragment", [
    (["--method", "sparseloco", "--set", "method.mean='senders'"], "method.mean", "a message of zeros"),
    (["--method", "allreduce"], "method.name", "meet only at outer steps (local_sgd, diloco, sparseloco)"),
    (["--method", "diloco", "--set", "method.group_size=2"], "method.group_size", "must be 1 with --elastic"),
    (["--method", "diloco", "--set", "train.backend='nccl'"], "train.backend", "gloo groups"),
])
def test_an_elastic_job_refuses_what_it_would_ignore_or_cannot_run(tmp_path, capsys, args, field, fragment):
    code = main(["train", "--elastic", "--workers", "2", "--epochs", "1", *args, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"lowband: error: {field}="), err
    assert fragment in err, err
    assert not (tmp_path / "runs").exists()


def test_a_job_that_ends_well_behind_its_best_epoch_says_so_with_its_workers():
    """The collapse a job met when churn left one DiLoCo worker (val loss 1.58 at epoch 3, chance, 2.31, at the
    end; a fixed run of one worker stalls the same way): said in one line, with the quorums' sizes after the
    best epoch; a job that ends near its best says nothing."""
    from lowband.records import EpochRecord
    from lowband.training.elastic.job import regression

    epochs = [EpochRecord(epoch=e, val_loss=v) for e, v in enumerate([2.2, 1.85, 1.58, 1.84, 2.1, 2.31], 1)]
    rounds = [{"epoch": e, "members": [0, 1, 2] if e <= 3 else [1]} for e in range(1, 7) for _ in range(4)]
    said = regression(epochs, rounds)
    assert said is not None and "2.3100, 46% above its best (1.5800 at epoch 3)" in said and "1..1 worker(s)" in said
    assert "\n" not in said
    steady = [EpochRecord(epoch=e, val_loss=v) for e, v in enumerate([2.2, 1.6, 1.58, 1.62], 1)]
    assert regression(steady, rounds) is None


class EmptiedCoordinator:
    """A coordinator restarted empty: no live worker for a while, then a joiner of another launcher registers
    again (its heartbeat found its key gone)."""

    def __init__(self, empty_looks: int):
        self.looks, self.empty_looks = 0, empty_looks

    def status(self):
        return "running"

    def live(self):
        self.looks += 1
        return [] if self.looks <= self.empty_looks else [7]

    def keep_for(self):
        pass


def test_a_launcher_whose_workers_are_gone_waits_out_an_emptied_coordinator(monkeypatch):
    """Its own workers all killed while joiners train on, a launcher that asks a coordinator just restarted
    empty must not end the job at the first empty answer (it did: exit 137, and --resume was then refused while
    the joiners trained); it ends it once no worker has been live for dead_after_s + 5 s."""
    from lowband import config as C
    from lowband.training.elastic import job

    clock = [0.0]
    monkeypatch.setattr(job.time, "monotonic", lambda: clock[0])
    e = C.ElasticConfig(on=True, dead_after_s=2.0)
    killed = [-9, -9, -9]  # the launcher's own three workers, each SIGKILLed
    watch = job.ElasticWatch(EmptiedCoordinator(empty_looks=3), e)
    for _ in range(3):  # empty for 3 looks, 1 s apart: within dead_after_s + 5
        assert watch.done([], killed) is None
        clock[0] += 1.0
    assert watch.done([], killed) is None  # the joiner is back: the job goes on
    gone = job.ElasticWatch(EmptiedCoordinator(empty_looks=10**6), e)
    assert gone.done([], killed) is None
    clock[0] += 7.0  # no live worker for dead_after_s + 5 s: every worker left
    assert gone.done([], killed) == 137
