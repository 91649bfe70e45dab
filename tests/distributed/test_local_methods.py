"""MA-DNN, E-DNN and EC-DNN across real processes: averaging invariants and bytes per round."""

from __future__ import annotations

import json

import pytest
import torch

from lowband.run.metrics import read_metrics
from tests.conftest import cli, small
from tests.distributed.helpers import initial_model, run_workers

PARAM_BYTES = sum(p.numel() for p in initial_model().parameters()) * 4


def test_ma_dnn_averages_exactly_every_tau_steps(tmp_path):
    world, steps, tau = 4, 7, 3
    assert run_workers("tests.distributed.helpers:local_sgd_trace", [str(tmp_path), str(steps), str(tau)],
                       world, str(tmp_path)) == 0
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for s in range(steps):
        pre = torch.stack([r["pre"][s] for r in ranks])
        post = torch.stack([r["post"][s] for r in ranks])
        if (s + 1) % tau == 0:
            for r in range(world):
                assert torch.equal(post[r], post[0])  # identical on every rank
            torch.testing.assert_close(post[0], pre.mean(0), rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(post, pre)  # untouched between rounds
            assert not torch.equal(post[1], post[0])  # and the ranks have drifted apart
    rounds = steps // tau
    for r in ranks:
        assert r["stats"]["params"]["sent"] == pytest.approx(rounds * 2 * (world - 1) / world * PARAM_BYTES)


def run(tmp_path, method: str, *extra: str, workers: int = 2, epochs: int = 2):
    run_dir = tmp_path / method
    p = cli("train", "--method", method, "--workers", str(workers), "--epochs", str(epochs), "--run-dir", str(run_dir),
            *small(tmp_path, *extra))
    assert p.returncode == 0, p.stderr
    return run_dir, read_metrics(str(run_dir))


def steps_per_epoch(run_dir) -> int:
    """Steps per epoch of a small() run: 600 samples -> 480 train, 10% of it held out for validation."""
    from lowband.training.runconfig import read_run_config
    from lowband.training.trainer import worker_data

    cfg = read_run_config(str(run_dir))
    return worker_data(cfg, cfg.train.workers).steps


@pytest.mark.parametrize("codec", ["fp32", "int8"])
def test_ec_dnn_bytes_per_round_are_two_model_all_gathers(tmp_path, codec):
    from lowband.comm.value_codecs import parse_codec

    # 600 samples -> 432 train -> 216 per worker -> 13 steps/epoch, 26 steps; rounds end at 8, 16, 24
    run_dir, records = run(tmp_path, "ec_dnn", "--set", "method.tau=8", "--set", "method.round_evals=10",
                           "--set", f"method.codec='{codec}'")
    assert steps_per_epoch(run_dir) == 13
    gathers = 3 + 3 + 1  # three ensembles, three compressed-model gathers, the final ensemble
    model = parse_codec(codec).payload_bytes(PARAM_BYTES // 4)
    assert records[-1].bytes["params"]["sent"] == gathers * (2 - 1) * model
    assert records[-1].bytes["params"]["recv"] == gathers * (2 - 1) * model
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        assert len(r["local_acc"]) == 2
        assert r["diff_lg"] == pytest.approx(r["global_acc"] - sum(r["local_acc"]) / 2)
    last = records[-1]
    assert last.test_acc_L == last.test_acc_ranks[last.train_loss_ranks.index(min(last.train_loss_ranks))]
    assert (run_dir / "model.safetensors").exists() and (run_dir / "model_L.safetensors").exists()


def test_ensemble_global_model_is_saved_as_members_plus_weights(tmp_path):
    from safetensors.torch import load_file

    run_dir, records = run(tmp_path, "ensemble", epochs=1)
    assert records[-1].bytes["params"]["sent"] == (2 - 1) * PARAM_BYTES  # one gather, at the end
    saved = load_file(str(run_dir / "model.safetensors"))
    assert torch.equal(saved["weights"], torch.tensor([0.5, 0.5]))
    assert {k.split(".")[1] for k in saved if k.startswith("members.")} == {"0", "1"}
    assert not torch.equal(saved["members.0.fc.weight"], saved["members.1.fc.weight"])  # different inits


def test_local_sgd_run_reports_rounds_and_global_model(tmp_path):
    run_dir, records = run(tmp_path, "local_sgd", "--set", "method.tau=4", epochs=1)
    assert steps_per_epoch(run_dir) == 13
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rounds] == [4, 8, 12]
    # 3 rounds of one allreduce each, and one more to form the final global model
    assert records[-1].bytes["params"]["sent"] == pytest.approx(4 * 2 * (2 - 1) / 2 * PARAM_BYTES)


def test_an_early_stop_still_saves_the_global_model(tmp_path):
    from safetensors.torch import load_file

    run_dir, records = run(tmp_path, "ensemble", "--set", "train.target_accuracy=0.01", "--set",
                           "train.stop_at_target=true", epochs=5)
    assert [r.epoch for r in records] == [1] and records[0].reached_target_epoch == 1
    assert "weights" in load_file(str(run_dir / "model.safetensors"))  # the ensemble, not rank 0's model
    assert (run_dir / "model_L.safetensors").exists()
