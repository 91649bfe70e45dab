"""Codistillation whose rank 0 is killed: the survivors' results are written and the loss is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from safetensors.torch import load_file

from lowband.run import checkpoint
from lowband.run.metrics import read_metrics
from tests.conftest import ROOT, children, small
from tests.faults.test_processes import rank_of, wait_for


def kill_codistill_rank(tmp_path, rank: int, epochs: int, exchange: str = "store") -> tuple[str, subprocess.Popen, str, str]:
    """A 3-worker codistillation run whose rank `rank` is killed after its first checkpoint, run to its end:
    (run dir, the launcher, its stdout, its stderr)."""
    run = str(tmp_path / "run")
    args = ["train", "--method", "codistill", "--workers", "3", "--epochs", str(epochs), "--run-dir", run,
            *small(tmp_path), "--samples", "2000", "--batch-size", "8", "--set", "method.interval=20",
            "--set", f"method.exchange={exchange}"]
    proc = subprocess.Popen([sys.executable, "-m", "lowband", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
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
