"""The GPT language model on text, on real workers: every method of the lm suite trains on 4 workers,
and the recorded bits per byte are what the final model scores, computed again here."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from lowband.comparison.request import load_suite
from lowband.run.metrics import read_metrics
from tests.conftest import cli

TINY = ["--dataset", "text", "--model", "gpt", "--set", "model.size=nano", "--set", "data.max_bytes=20000",
        "--set", "data.context=16", "--batch-size", "8", "--set", "optim.name=adamw", "--set", "optim.lr=0.003",
        "--set", "optim.lr_scaling=none", "--set", "train.timeout_s=60"]


def test_the_recorded_bits_per_byte_are_the_final_models_own(tmp_path):
    import torch

    import lowband
    from lowband.data import load_dataset

    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run), *TINY)
    assert p.returncode == 0, p.stderr
    last = read_metrics(str(run))[-1]
    assert last.corpus_bytes == 20000 and len(last.corpus_sha256) == 64
    model = lowband.load_model(str(run))
    result = lowband.Run.from_dir(str(run))
    assert result.val_bpb == last.val_bpb and result.test_bpb == last.test_bpb
    data = load_dataset(result.config.data)
    with torch.no_grad():
        logits = model(data.x_val).double().numpy()
    # cross-entropy in NumPy: log-sum-exp minus the target's logit, every position, in bits
    top = logits.max(-1, keepdims=True)
    log_z = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    target = np.take_along_axis(logits, data.y_val.numpy()[..., None], -1)[..., 0]
    assert last.val_bpb == pytest.approx((log_z - target).mean() / math.log(2), rel=1e-4)
    assert last.val_acc == pytest.approx((logits.argmax(-1) == data.y_val.numpy()).mean(), abs=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_method_of_the_lm_suite_trains_on_four_workers(tmp_path):
    methods = load_suite("lm")["methods"]
    suite = tmp_path / "lm_tiny.toml"
    teacher = ("train --method single --dataset text --model gpt --set model.size=nano --set data.max_bytes=20000 "
               "--set data.context=16 --batch-size 8 --epochs 1 --run-dir {folder}/teacher")
    suite.write_text(
        f"methods = {methods!r}\nprepare = [{teacher!r}]\n"
        "[config.train]\nworkers = 4\nepochs = 1\nbatch_size = 8\ntimeout_s = 60.0\n"
        "[config.data]\nname = 'text'\nmax_bytes = 20000\ncontext = 16\n"
        "[config.model]\nname = 'gpt'\nsize = 'nano'\n"
        "[config.optim]\nname = 'adamw'\nlr = 0.003\nlr_scaling = 'none'\n"
        "[method_defaults.edl]\nteacher = '{folder}/teacher'\nlocal_teachers = 1\n")
    p = cli("compare", "--config", str(suite), "--out", str(tmp_path), "-q", timeout=850)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    folder = next(tmp_path.glob("compare-*"))
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert [r["label"] for r in rows] == methods
    for r in rows:
        assert r["status"] == "ok" and 0 < float(r["val_bpb"]) < 8.0, r
        assert float(r["step_s"]) > 0  # the dedicated-machine calibration ran
    silent = {"single", "ensemble"}  # one worker; independent models that meet only at the end
    assert all(float(r["bytes_sent_per_worker"]) > 0 for r in rows if r["method"] not in silent)
    assert "val bpb" in p.stdout and "Target bits per byte (validation)" in p.stdout
    assert "Which method for my link (dedicated machines" in p.stdout
    report = (folder / "report.md").read_text()
    assert "bits per byte" in report and "sha256" in report
