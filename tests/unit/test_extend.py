"""Extending a finished run (`train --resume R --epochs N`): the schedule is re-planned over N, and says so."""

from __future__ import annotations

from lowband import config as C
from lowband.cli import parser, resume_config
from lowband.run.schedule import lr_at
from lowband.training import runconfig


def _run(tmp_path, schedule: str = "cosine") -> str:
    cfg = C.from_dict({"method": {"name": "allreduce"}, "train": {"epochs": 4},
                       "optim": {"schedule": schedule, "warmup_epochs": 0}}, runconfig.method_configs())
    tmp_path.mkdir(exist_ok=True)
    runconfig.write_config(cfg, str(tmp_path))
    return str(tmp_path)


def test_extending_a_cosine_run_replans_over_the_new_total_and_says_so(tmp_path):
    run = _run(tmp_path)
    cfg, note = resume_config(parser().parse_args(["train", "--resume", run, "--epochs", "8"]))
    assert cfg.train.epochs == 8
    assert runconfig.read_run_config(run).train.epochs == 4  # written by session.start once its checks pass
    assert note and "train.epochs 4 -> 8" in note and "re-planned over 8 epochs" in note
    # what the resumed epochs get: the 8-epoch curve, which at epoch 4 is back at half the peak
    assert lr_at(4, cfg.optim, cfg.train.epochs, 1.0, 0.0) == cfg.optim.lr * 0.5


def test_resuming_with_the_same_epochs_or_a_constant_rate_says_nothing(tmp_path):
    assert resume_config(parser().parse_args(["train", "--resume", _run(tmp_path / "a"), "--epochs", "4"]))[1] is None
    assert resume_config(parser().parse_args(["train", "--resume", _run(tmp_path / "b", "constant"),
                                              "--epochs", "8"]))[1] is None
