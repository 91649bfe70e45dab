"""What an elastic job refuses before anything starts: one line naming the field, exit 2, no run directory."""

from __future__ import annotations

import pytest

from lowband.cli import main


@pytest.mark.parametrize("args, field, fragment", [
    (["--method", "sparseloco"], "method.name", "error buffers are each worker's own"),
    (["--method", "allreduce"], "method.name", "meet only at outer steps (local_sgd, diloco)"),
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
