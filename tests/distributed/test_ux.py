"""What a user meets around a run: logger plug-ins fed by real workers, progress lines, own data, the Python API."""

from __future__ import annotations

import json

from lowband.run.metrics import read_metrics
from tests.conftest import cli, small


def test_a_logger_plugin_gets_every_epoch_of_a_real_run(tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run),
            "--logger", "tests.fake_logger:FakeLogger", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    records = read_metrics(str(run))
    logged = [json.loads(line) for line in (run / "fake_logger.rank0.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in logged] == [1, 2] and logged[0]["method"] == "allreduce"
    for rec, x in zip(records, logged, strict=True):  # the same figures as metrics.jsonl, the source of truth
        assert x["scalars"]["accuracy/val_acc"] == rec.val_acc
        assert x["scalars"]["bytes/grad/sent"] == rec.bytes["grad"]["sent"]
        assert x["scalars"]["loss/train"] == rec.train_loss
    assert (run / "fake_logger.rank0.closed").exists()
    assert not (run / "fake_logger.rank1.jsonl").exists()  # one model, one reporter: rank 0's
    lines = [line for line in p.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2 and lines[1].startswith("epoch   2/2") and "ETA 0s" in lines[1]


def test_quiet_prints_no_epoch_lines(tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--method", "single", "--epochs", "1", "--run-dir", str(run), "--quiet", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "epoch " not in p.stdout and "epoch   1/1" in (run / "train.log").read_text()


def api_small(tmp_path) -> dict:
    import os

    return {"samples": 600, "batch_size": 16, "data.cache_dir": os.environ["LOWBAND_TEST_CACHE"],
            "train.timeout_s": 60.0}


def test_python_api_trains_and_loads_the_model_it_scored(tmp_path):
    import torch

    import lowband
    from lowband.data import load_dataset

    run = lowband.train(method="local_sgd", workers=2, epochs=1, run_dir=str(tmp_path / "r"), quiet=True,
                        **{"method.tau": 4}, **api_small(tmp_path))
    assert run.method == "local_sgd" and run.epochs == 1 and run.run_dir == str(tmp_path / "r")
    last = read_metrics(run.run_dir)[-1]
    assert (run.val_acc, run.test_acc, run.bytes_sent_per_worker) == (
        last.val_acc, last.test_acc, last.bytes_sent_per_worker)
    assert run.bytes_sent_per_worker > 0
    model = lowband.load_model(run.run_dir)
    assert isinstance(model, torch.nn.Module) and not model.training
    data = load_dataset(run.config.data)
    with torch.no_grad():
        acc = (model(data.x_test).argmax(1) == data.y_test).double().mean().item()
    assert acc == run.test_acc  # the loaded model is the one the record scored
    import json
    import os
    import stat

    from lowband.run.checkpoint import model_metadata

    path = os.path.join(run.run_dir, "model.safetensors")
    meta = model_metadata(path)
    assert (meta["method"], meta["lowband_version"], json.loads(meta["in_shape"]), int(meta["num_classes"])) == (
        "local_sgd", lowband.__version__, list(data.in_shape), data.num_classes)
    assert json.loads(meta["model"])["name"] == run.config.model.name
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == stat.S_IMODE(os.stat(os.path.join(run.run_dir, "config.toml")).st_mode)  # like every run file


def test_python_api_compares_methods_and_returns_their_runs(tmp_path):
    import lowband

    result = lowband.compare(["single", "local_sgd:tau=4"], workers=2, epochs=1, out=str(tmp_path), quiet=True,
                             **api_small(tmp_path))
    assert [r.method for r in result.runs] == ["single", "local_sgd"]
    assert all(0 <= r.val_acc <= 1 for r in result.runs)
    assert "local_sgd:tau=4" in result.table and result.runs[1].bytes_sent_per_worker > 0


def test_a_run_on_your_own_data(tmp_path):
    import numpy as np

    from tests import mydata

    path = tmp_path / "blobs.npz"
    np.savez(path, **mydata.as_dict())
    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--dataset", str(path),
            "--model", "mlp", "--batch-size", "16", "--run-dir", str(run), "--set", "train.timeout_s=60")
    assert p.returncode == 0, p.stderr
    last = read_metrics(str(run))[-1]
    assert last.test_acc > 0.9  # two classes three standard deviations apart


def test_tensorboard_events_read_back_with_tensorboards_own_reader(tmp_path):
    import pytest

    pytest.importorskip("tensorboard", reason="the optional tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run),
            "--logger", "tensorboard", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    records = read_metrics(str(run))
    val = events.Scalars("accuracy/val_acc")
    assert [e.step for e in val] == [r.epoch for r in records]
    assert [e.value for e in val] == pytest.approx([r.val_acc for r in records])
    assert [e.value for e in events.Scalars("bytes/grad/sent")] == pytest.approx(
        [r.bytes["grad"]["sent"] for r in records])
