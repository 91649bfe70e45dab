"""What a user meets around a run: logger plug-ins fed by real workers, progress lines, own data, the Python API."""

from __future__ import annotations

import json

from lowband.metrics import read_metrics
from tests.conftest import cli, small


def test_a_logger_plugin_gets_every_epoch_of_a_real_run(tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run),
            "--logger", "tests.fake_logger:FakeLogger", *small(tmp_path))
    assert p.returncode == 0, p.stderr
    records = read_metrics(str(run))
    logged = [json.loads(line) for line in (run / "fake_logger.rank0.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in logged] == [1, 2] and logged[0]["method"] == "allreduce"
    for rec, x in zip(records, logged):  # the same figures as metrics.jsonl, the source of truth
        assert x["scalars"]["accuracy/val_acc"] == rec["val_acc"]
        assert x["scalars"]["bytes/grad/sent"] == rec["bytes"]["grad"]["sent"]
        assert x["scalars"]["loss/train"] == rec["train_loss"]
    assert (run / "fake_logger.rank0.closed").exists()
    assert not (run / "fake_logger.rank1.jsonl").exists()  # one model, one reporter: rank 0's
