"""Codistillation whose rank 0 is killed: the survivors' results are written and the loss is named."""

from __future__ import annotations

import os
import signal
import subprocess

from safetensors.torch import load_file

from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from tests.conftest import children, cli, small, start_cli
from tests.faults.test_processes import rank_of, wait_for


def kill_codistill_rank(tmp_path, rank: int, epochs: int, exchange: str = "store") -> tuple[str, subprocess.Popen, str, str]:
    """A 3-worker codistillation run whose rank `rank` is killed after its first checkpoint, run to its end:
    (run dir, the launcher, its stdout, its stderr)."""
    run = str(tmp_path / "run")
    args = ["train", "--method", "codistill", "--workers", "3", "--epochs", str(epochs), "--run-dir", run,
            *small(tmp_path), "--samples", "2000", "--batch-size", "8", "--set", "method.interval=20",
            "--set", f"method.exchange={exchange}",
            *(["--set", "method.server_timeout_s=3"] if exchange == "server" else [])]  # a dead peer is noticed in 3 s
    proc = start_cli(*args, merged=False)
    wait_for(lambda: checkpoint.epochs_saved(run, rank) or proc.poll() is not None, 120, f"rank {rank}'s first checkpoint")
    victim = next(pid for pid in children(proc.pid) if rank_of(pid) == rank)
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    return run, proc, out, err


def test_killed_rank_0_leaves_the_survivors_model_and_a_nonzero_exit(tmp_path):
    run, proc, out, err = kill_codistill_rank(tmp_path, 0, epochs=4)
    assert proc.returncode == 128 + signal.SIGKILL, err
    last = err.strip().splitlines()[-1]
    assert "lost worker(s) 0" in last and "2 of 3 finished" in last and "done:" not in out
    for rank in (1, 2):
        assert [r.epoch for r in read_metrics(run, f"metrics.rank{rank}.jsonl")] == [1, 2, 3, 4]
    kept = load_file(os.path.join(run, "model.safetensors"))
    best = int(last.split("now rank ")[1].split("'")[0])
    survivor = load_file(os.path.join(run, f"model.rank{best}.safetensors"))
    assert kept.keys() == survivor.keys() and all(kept[k].equal(survivor[k]) for k in kept)


def test_bad_peer_files_in_the_store_are_skipped_once_each_and_the_run_finishes(tmp_path):
    """A peer checkpoint of another architecture (at the last step a peer could reach, so every exchange
    meets it as the newest) and garbage under a step no peer could write: one warning per file, never the
    end of the run; the teachers are the peers' own checkpoints."""
    import torch

    from lowband.comm.store import CheckpointStore

    store, run = tmp_path / "store", str(tmp_path / "run")
    steps_per_epoch, epochs = 27, 2  # 433 training samples, batch 16: each model trains on all of them
    last = steps_per_epoch * epochs + epochs
    other = {"w": torch.zeros(5, 3), "b": torch.zeros(3)}
    for model in (0, 1):
        CheckpointStore(str(store)).publish(model, last, other)
        (store / f"model{model}" / "step9999999999.safetensors").write_bytes(b"\x00garbage" * 100)
    p = cli("train", "--method", "codistill", "--workers", "2", "--epochs", str(epochs), "--run-dir", run,
            *small(tmp_path), "--set", "method.interval=5", "--set", f"method.store={str(store)!r}", timeout=200)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    with open(os.path.join(run, "train.log")) as f:
        said = f.read() + p.stderr
    for model in (0, 1):
        bad, future = (str(store / f"model{model}" / name) for name in (f"step{last:010d}.safetensors",
                                                                          "step9999999999.safetensors"))
        assert said.count(f"skipping another architecture's checkpoint {bad} (") in (1, 2)  # console and train.log
        assert f"skipping impossible checkpoint {future} (step 9999999999 is past the run's last step {last}" in said
        assert f"checkpoint {bad}" not in said.replace(f"skipping another architecture's checkpoint {bad}", "")
    taught = []
    for rank in (0, 1):
        records = read_metrics(run, f"metrics.rank{rank}.jsonl" if rank else "metrics.jsonl")
        assert [r.epoch for r in records] == [1, 2]
        taught += [int(s) for r in records for s in r.extra["teacher_steps"].values()]
    # the models run unsynchronised (wait_s 0) and an epoch takes ~0.05 s: one may finish before the other
    # publishes its first checkpoint, so only the slower one is sure to be taught; every teacher is a real one
    assert taught and all(0 < s < last and s % 5 == 0 for s in taught)
    assert os.path.exists(os.path.join(run, "model.safetensors"))
