"""Experiment loggers: the scalars each epoch record becomes, the sink feeding them, and bad names."""

import importlib.util
import logging
import os
from dataclasses import replace

import pytest

from lowband import cli
from lowband.errors import ConfigError
from lowband.records import EpochRecord
from lowband.run import loggers
from lowband.run.metrics import MetricsSink
from lowband.run.rundir import Stream
from tests import fake_logger

RECORD = EpochRecord.from_json({
    "epoch": 3, "samples": 900, "steps": 30, "train_loss": 0.5, "train_loss_ranks": [0.4, 0.6],
    "val_acc": 0.8, "test_acc": 0.75, "val_acc_L": 0.82, "test_acc_L": None, "lr": 0.1, "samples_per_s": 1000.0,
    "bytes_sent_per_worker": 1500.0, "bytes_recv_per_worker": 1400.0,
    "bytes": {"grad": {"sent": 1000.0, "recv": 900.0, "calls": 3, "wire": 1000.0},
              "init": {"sent": 500.0, "recv": 500.0, "calls": 1, "wire": 500.0}},
    "bytes_total": {"grad": {"sent": 2000.0, "recv": 1800.0, "calls": 6, "wire": 2000.0}},
    "time": {"compute_s": 1.5, "comm_s": 0.5, "wait_s": 0.0, "elapsed_s": 9.0}, "reached_target_epoch": None,
    "diff_lg": 0.03, "ensemble": "margin",
})


def test_a_record_becomes_flat_scalars():
    s = loggers.scalars(RECORD)
    assert s == {
        "loss/train": 0.5, "accuracy/val_acc": 0.8, "accuracy/test_acc": 0.75, "accuracy/val_acc_L": 0.82,
        "lr": 0.1, "samples_per_s": 1000.0, "bytes/sent_per_worker": 1500.0, "bytes/recv_per_worker": 1400.0,
        "bytes/grad/sent": 1000.0, "bytes/grad/recv": 900.0, "bytes/init/sent": 500.0, "bytes/init/recv": 500.0,
        "seconds/compute": 1.5, "seconds/comm": 0.5, "seconds/wait": 0.0, "seconds/elapsed": 9.0, "method/diff_lg": 0.03,
    }


def test_the_sink_feeds_every_record_to_its_loggers_and_closes_them(tmp_path):
    fake = fake_logger.FakeLogger(str(tmp_path), 0, {"method": {"name": "allreduce"}})
    sink = MetricsSink(Stream(str(tmp_path / "metrics.jsonl")), True, 5, logging.getLogger("test-sink"), [fake])
    sink.write(RECORD)
    sink.write(replace(RECORD, epoch=4, val_acc=0.9))
    sink.close()
    assert [e for e, _ in fake.logged] == [3, 4]
    assert fake.logged[1][1]["accuracy/val_acc"] == 0.9 and fake.closed


def test_an_elastic_jobs_line_counts_time_by_the_jobs_clock(tmp_path):
    """The worker that writes an elastic job's epoch line may have opened its sink only now: its elapsed time
    and ETA are the job's (150 s after 3 of 5 epochs: 50 s an epoch, 100 s to go), not this process's."""
    sink = MetricsSink(Stream(str(tmp_path / "m.jsonl")), True, 5, logging.getLogger("test-sink"),
                       job_clock=lambda: 150.0)
    assert sink.progress(3) == "elapsed 2m30s  ETA 1m40s"
    plain = MetricsSink(Stream(str(tmp_path / "p.jsonl")), True, 5, logging.getLogger("test-sink"))
    assert plain.progress(3).startswith("elapsed 0s")  # this process's own start: a moment ago


def test_an_inactive_sink_logs_nothing(tmp_path):
    fake = fake_logger.FakeLogger(str(tmp_path), 1, {})
    sink = MetricsSink(Stream(str(tmp_path / "m.jsonl")), False, 5, logging.getLogger("test-sink"), [fake])
    sink.write(RECORD)
    assert fake.logged == [] and not os.path.exists(tmp_path / "m.jsonl")


def test_built_loggers_by_spec():
    (built,) = loggers.build(["tests.fake_logger:FakeLogger"], "/tmp/x", 2, {"a": 1})
    assert isinstance(built, fake_logger.FakeLogger) and built.rank == 2 and built.config == {"a": 1}


@pytest.mark.parametrize("name, fragment", [
    ("tensorbord", "unknown logger; known: tensorboard, wandb"),
    ("tests.fake_logger:Nope", "could not import the factory"),
    ("tests.fake_logger:INSTANCES", "is not callable"),
])
def test_bad_logger_names(name, fragment):
    with pytest.raises(ConfigError, match=fragment):
        loggers.check([name])


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_package_stops_the_command_with_one_line_and_no_run_dir(name, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda pkg, *a: None if pkg == name else real(pkg, *a))
    code = cli.main(["train", "--method", "single", "--epochs", "1", "--logger", name, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert f"train.loggers='{name}'" in err and f"pip install {name}" in err
    assert os.listdir(tmp_path) == []


def test_an_unknown_logger_is_a_config_error_at_resolve():
    with pytest.raises(ConfigError, match="train.loggers"):
        cli.config_from_args(cli.parser().parse_args(["config", "--logger", "mlflow"]))


def test_each_epoch_line_tells_the_whole_run(tmp_path, monkeypatch, caplog):
    from lowband.run import metrics

    clock = iter([100.0, 110.0, 130.0])  # start; epochs 3 and 4 end 10 s and 30 s later
    monkeypatch.setattr(metrics.time, "monotonic", lambda: next(clock))
    sink = MetricsSink(Stream(str(tmp_path / "m.jsonl")), True, 6, logging.getLogger("test-progress"))
    with caplog.at_level(logging.INFO, logger="test-progress"):
        sink.write(RECORD)  # a resumed run: its first epoch here is 3
        sink.write(replace(RECORD, epoch=4))
    first, second = caplog.messages
    assert first.startswith("epoch   3/6") and "val acc 0.8000" in first and "sent/worker 1.50 kB" in first
    assert first.endswith("elapsed 10s  ETA 30s")  # 3 epochs left at 10 s each
    assert second.endswith("elapsed 30s  ETA 30s")  # 2 left at 15 s each


@pytest.mark.parametrize("seconds, text", [(4.4, "4s"), (185, "3m05s"), (3720, "1h02m")])
def test_clock(seconds, text):
    from lowband.run.metrics import clock

    assert clock(seconds) == text


def test_quiet_keeps_epoch_lines_off_the_console_only(tmp_path, monkeypatch):
    from lowband.run.metrics import setup_logging

    monkeypatch.setenv("LOWBAND_QUIET", "1")
    log = setup_logging(str(tmp_path), 0)
    console, logfile = log.handlers
    assert console.level == logging.WARNING and logfile.level == logging.NOTSET
    for h in log.handlers:
        h.close()
