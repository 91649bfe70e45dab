"""Past train.eval_ranks workers, only rank 0, the lowest training loss and evenly spaced ranks evaluate their
own model; the others' per-rank figures are null, the run's own figures unchanged (issue 64: 64 workers on one
machine spent most of an epoch evaluating every rank's model)."""

from __future__ import annotations

import json

from tests.conftest import cli, small


def records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_only_the_chosen_ranks_evaluate_their_own_model_and_the_run_figures_are_unchanged(tmp_path):
    args = ["--method", "local_sgd", "--workers", "3", "--epochs", "1", *small(tmp_path), "--set", "method.tau=4"]
    every, some = tmp_path / "every", tmp_path / "some"
    assert cli("train", *args, "--run-dir", str(every), "-q").returncode == 0
    p = cli("train", *args, "--set", "train.eval_ranks=1", "--run-dir", str(some), "-q")
    assert p.returncode == 0, p.stderr
    a, b = records(every)[-1], records(some)[-1]
    best = min(range(3), key=lambda r: b["train_loss_ranks"][r])
    assert [v is not None for v in b["val_acc_ranks"]] == [r in {0, best} for r in range(3)]
    assert all(v is not None for v in a["val_acc_ranks"])
    for key in ("val_acc", "test_acc", "val_acc_L", "test_acc_L", "train_loss"):
        assert a[key] == b[key], key  # the same training; only who evaluates changed
    assert [b["val_acc_ranks"][r] for r in (0, best)] == [a["val_acc_ranks"][r] for r in (0, best)]
