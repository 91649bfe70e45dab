"""`lowband train` end to end with real worker processes: records, bytes, checkpoints, resume."""

from __future__ import annotations

import json
import math

import pytest
import tomllib
import torch
from safetensors.torch import load_file

from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from tests.conftest import cli, small, whole_and_resumed

CNN1D_PARAMS = 5210  # cnn1d on MNIST-1D: 3 convolutions + linear(125 -> 10)


def goyal_cosine_lr(epoch: float, base: float, workers: int, warmup: float, total: int) -> float:
    """Linear scaling with gradual warm-up from the one-worker rate (Goyal et al. 2017), then cosine to 0."""
    peak = base * workers
    if epoch < warmup:
        return base + (peak - base) * epoch / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (epoch - warmup) / (total - warmup)))


def test_allreduce_run_writes_records_bytes_and_equal_checkpoints(tmp_path):
    run = tmp_path / "run"
    p = cli("train", "--method", "allreduce", "--workers", "2", "--epochs", "2", "--run-dir", str(run),
            *small(tmp_path, "--lr", "0.03", "--set", "method.warmup_epochs=1.5"))
    assert p.returncode == 0, p.stderr
    records = read_metrics(str(run))
    assert [r.epoch for r in records] == [1, 2]
    steps = 432 // 2 // 16  # 600 samples, 80% train less 10% validation, 2 shards, batch 16
    for r in records:  # the rate of the epoch's last step: scaled by the 2 workers, warmed up over 1.5 epochs
        at = r.epoch - 1 + (steps - 1) / steps
        assert r.lr == pytest.approx(goyal_cosine_lr(at, 0.03, 2, 1.5, 2), rel=1e-9)
        # every worker's samples of the epoch, not one rank's, over the epoch's training time
        assert r.samples_per_s == pytest.approx(steps * 16 * 2 / r.time["epoch_train_s"], rel=0.01)
    last = records[-1]
    assert last.steps == 2 * steps and last.samples == 2 * steps * 16 * 2
    ring = 2 * (2 - 1) / 2 * CNN1D_PARAMS * 4
    assert last.bytes["grad"]["sent"] == pytest.approx(2 * steps * ring)
    assert last.bytes["grad"]["recv"] == pytest.approx(2 * steps * ring)
    assert len(last.test_acc_ranks) == 2 and last.test_acc == last.test_acc_ranks[0]
    assert last.test_acc == pytest.approx(accuracy_of(run), abs=1e-12)  # what the final model scores here
    assert set(last.time) >= {"compute_s", "comm_s", "wait_s", "eval_s", "elapsed_s"}
    assert last.time["comm_s"] > 0

    ranks = [checkpoint.load_state(checkpoint.rank_path(str(run), r, 2)) for r in (0, 1)]
    for key, value in ranks[0]["model"].items():
        assert torch.equal(value, ranks[1]["model"][key]), key
    final = load_file(str(run / "model.safetensors"))
    assert all(torch.equal(final[k], v) for k, v in ranks[0]["model"].items())
    cfg = tomllib.loads((run / "config.toml").read_text())
    assert cfg["method"]["name"] == "allreduce" and cfg["train"]["epochs"] == 2
    assert "epoch   2/2" in (run / "train.log").read_text()


def accuracy_of(run) -> float:
    """Test accuracy of RUN/model.safetensors on the run's own test split, computed here."""
    from lowband.config import DataConfig, ModelConfig
    from lowband.data import load_dataset
    from lowband.models import build_model

    cfg = tomllib.loads((run / "config.toml").read_text())
    data = load_dataset(DataConfig(**cfg["data"]))
    model = build_model(ModelConfig(**cfg["model"]), data.in_shape, data.num_classes)
    model.load_state_dict(load_file(str(run / "model.safetensors")))
    with torch.no_grad():
        predicted = model.eval()(data.x_test).argmax(1)
    assert len(data.y_test) == 120  # 20% of 600
    return (predicted == data.y_test).double().mean().item()


def test_resume_continues_exactly_where_the_run_stopped(tmp_path):
    args = ["--method", "single", *small(tmp_path, "--set", "optim.schedule='constant'")]
    whole, split = whole_and_resumed(tmp_path, args, 2, 3)
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r.epoch for r in read_metrics(str(split))] == [1, 2, 3]
    assert [r.train_loss for r in read_metrics(str(split))] == [r.train_loss for r in read_metrics(str(whole))]


def test_resume_refuses_to_change_the_config(tmp_path):
    run = tmp_path / "r"
    assert cli("train", "--method", "single", "--epochs", "1", "--run-dir", str(run), *small(tmp_path)).returncode == 0
    p = cli("train", "--resume", str(run), "--lr", "0.5")
    assert p.returncode == 2 and "only --epochs and --logger may change" in p.stderr


def test_compare_prints_one_table_and_writes_summary(tmp_path):
    import csv

    p = cli("compare", "--methods", "single,allreduce,local_sgd:tau=5", "--workers", "2", "--epochs", "1",
            "--out", str(tmp_path), *small(tmp_path))
    assert p.returncode == 0, p.stderr
    starts = [line for line in p.stdout.splitlines() if line.startswith("run ")]
    assert starts == ["run 1/3: single seed 0", "run 2/3: allreduce seed 0", "run 3/3: local_sgd:tau=5 seed 0"]
    table = p.stdout[p.stdout.index("method "):]
    for word in ("single", "allreduce", "local_sgd:tau=5", "sent/worker", "speed-up vs allreduce"):
        assert word in table
    (folder,) = tmp_path.glob("compare-*")
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["label"], r["workers"]) for r in rows] == [("single", "1"), ("allreduce", "2"), ("local_sgd:tau=5", "2")]
    assert float(rows[0]["bytes_sent_per_worker"]) == 0.0 and float(rows[1]["bytes_sent_per_worker"]) > 0
    assert float(rows[1]["speedup"]) == 1.0  # Allreduce is the yardstick; its own mean accuracy is the target
    assert json.loads((folder / "allreduce" / "metrics.jsonl").read_text().splitlines()[0])["epoch"] == 1
    assert (folder / "local_sgd_tau-5" / "rounds.jsonl").exists()


def test_compare_tunes_runs_seeds_and_resumes_without_rerunning(tmp_path):
    import csv

    p = cli("compare", "--methods", "single,allreduce", "--workers", "2", "--epochs", "1", "--seeds", "0,1",
            "--tune", "optim.lr=0.02,0.2", "--tune-epochs", "1", "--out", str(tmp_path), *small(tmp_path))
    assert p.returncode == 0, p.stderr
    (folder,) = tmp_path.glob("compare-*")
    with open(folder / "tuning.csv") as f:
        tuning = list(csv.DictReader(f))
    assert sorted((r["label"], r["value"]) for r in tuning) == [("allreduce", "0.02"), ("allreduce", "0.2"),
                                                                ("single", "0.02"), ("single", "0.2")]  # a grid
    chosen = {}
    for label in ("single", "allreduce"):  # the chosen value: the best final validation accuracy, read here
        mine = [r for r in tuning if r["label"] == label]
        accs = {r["value"]: read_metrics(str(folder / r["run_dir"]))[-1].val_acc for r in mine}
        chosen[label] = max(accs, key=lambda v: (accs[v], v == mine[0]["value"]))  # a tie: the first tried
        assert [r["chosen"] for r in mine] == ["yes" if r["value"] == chosen[label] else "no" for r in mine]
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["label"], r["seed"], r["tuned"]) for r in rows] == [
        (label, seed, f"optim.lr={chosen[label]}") for seed in ("0", "1") for label in ("single", "allreduce")]
    for r in rows:
        cfg = tomllib.loads((folder / f"{r['label']}_seed-{r['seed']}" / "config.toml").read_text())
        assert cfg["optim"]["lr"] == float(chosen[r["label"]]) and cfg["train"]["seed"] == int(r["seed"])
    table = p.stdout[p.stdout.index("method "):]
    assert [line.split()[:2] for line in table.splitlines()[2:4]] == [["single", "2"], ["allreduce", "2"]]  # seeds
    assert f"allreduce optim.lr={chosen['allreduce']}" in p.stdout
    assert "## Tuning" in (folder / "report.md").read_text()

    # resume: one run lost its completion record, another its directory; the rest, and every finished
    # tuning trial (recorded in tuning.db), are not run again
    done = (folder / "done.jsonl").read_text().splitlines()
    (folder / "done.jsonl").write_text("\n".join(done[:-1]) + "\n")
    import shutil

    shutil.rmtree(folder / "single_seed-1")
    before = {path: path.stat().st_mtime_ns for path in folder.glob("*/metrics.jsonl")}
    before.update({path: path.stat().st_mtime_ns for path in folder.glob("tune/*/*/metrics.jsonl")})
    again = cli("compare", "--resume", str(folder))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("finished already") == 2 and "\ntrial " not in again.stdout
    rerun = [path.parent.name for path, t in before.items() if path.stat().st_mtime_ns != t]
    assert rerun == ["allreduce_seed-1"]  # continued from its checkpoint (single_seed-1 was started afresh)
    assert [r.epoch for r in read_metrics(str(folder / "allreduce_seed-1"))] == [1]
    assert [r.epoch for r in read_metrics(str(folder / "single_seed-1"))] == [1]
    with open(folder / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert tuning_rows_of(folder) == tuning  # the study was continued, not redone


def tuning_rows_of(folder) -> list[dict]:
    import csv

    with open(folder / "tuning.csv") as f:
        return list(csv.DictReader(f))


def test_compare_budget_steps_gives_every_worker_about_allreduces_steps(tmp_path):
    p = cli("compare", "--methods", "single,allreduce", "--workers", "2", "--epochs", "2", "--budget", "steps",
            "--out", str(tmp_path), *small(tmp_path))
    assert p.returncode == 0, p.stderr
    (folder,) = tmp_path.glob("compare-*")
    single, allreduce = read_metrics(str(folder / "single")), read_metrics(str(folder / "allreduce"))
    # 432 training samples, batch 16: one worker takes 27 steps an epoch, each of two 13
    assert [r.epoch for r in single] == [1] and single[-1].steps == 27  # round(2 x 13 / 27) epochs
    assert [r.epoch for r in allreduce] == [1, 2] and allreduce[-1].steps == 26
    assert "budget steps" in p.stdout and "equal optimizer steps per worker" in (folder / "report.md").read_text()
