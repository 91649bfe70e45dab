"""Resuming a run with another number of workers (`lowband train --resume RUN --workers N
--allow-world-change`): the run's newest intact checkpoints are re-cut for N ranks before any
worker starts, so the workers themselves resume as usual.

The rule, for `old` ranks checkpointed and `new` ranks resuming:
- new rank r takes the model, optimizer, method state and random state of old rank r % old (the
  ranks of a data-parallel method hold the same or nearly the same model, so a grown world copies
  it and a shrunk one drops copies);
- the byte, time and sample counters of every old rank q go to new rank q % new (ranks beyond
  the old world start at zero), so the run's totals carry over exactly: no byte or sample is lost
  or counted twice (per-worker means are over the workers of the moment);
- the old checkpoints move, with their checksums, to checkpoints/world-OLD/ (kept, never deleted).

Methods whose ranks train different models, or whose groups are fixed, refuse
(`Method.world_change_refused`).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from lowband import atomic
from lowband.errors import UsageError
from lowband.run import checkpoint
from lowband.run.rundir import RunDir

_RANK_FILE = re.compile(r"rank\d+-epoch\d+\.pt(\.sha256)?$")


@dataclass(frozen=True)
class Resharded:
    epoch: int  # the epoch the new ranks resume after
    archive: str  # where the old ranks' checkpoints went
    passed: list[str]  # why newer epochs were passed over (damaged files)


def merge_counters(snapshots: list[dict[str, dict]]) -> dict[str, dict]:
    """Sum per-tag communicator counters (Communicator.snapshot) field by field."""
    merged: dict[str, dict] = {}
    for snap in snapshots:
        for tag, fields in snap.items():
            into = merged.setdefault(tag, {})
            for key, value in fields.items():
                into[key] = into.get(key, 0) + value
    return merged


def plan_sources(old: int, new: int) -> list[tuple[int, list[int]]]:
    """For each new rank: (the old rank whose state it takes, the old ranks whose counters it sums)."""
    return [(r % old, [q for q in range(old) if q % new == r]) for r in range(new)]


def reshard(run_dir: str, old: int, new: int) -> Resharded:
    """Re-cut `run_dir`'s checkpoints from `old` ranks to `new`; raise UsageError when no epoch has
    an intact checkpoint of every old rank (nothing is moved then)."""
    epoch, passed = checkpoint.resumable_epoch(run_dir, list(range(old)))
    if epoch == 0:
        raise UsageError(f"--allow-world-change: {run_dir} has no epoch with an intact checkpoint of each of its "
                         f"{old} ranks, so there is nothing to resume with {new} workers")
    folder = RunDir(run_dir).checkpoint_dir
    staging = os.path.join(folder, f".world-{new}-staging")
    shutil.rmtree(staging, ignore_errors=True)
    counted = [_counters(checkpoint.load_state(checkpoint.rank_path(run_dir, q, epoch))) for q in range(old)]
    for r, (source, summed) in enumerate(plan_sources(old, new)):
        state = checkpoint.load_state(checkpoint.rank_path(run_dir, source, epoch))
        state["comm"] = merge_counters([counted[q][0] for q in summed])
        state["samples"] = sum(counted[q][1] for q in summed)
        checkpoint.save_state(state, os.path.join(staging, checkpoint.rank_name(r, epoch)))
    archive = _archive_name(folder, old)
    os.makedirs(archive)
    for name in sorted(os.listdir(folder)):
        if _RANK_FILE.match(name):
            atomic.move(os.path.join(folder, name), os.path.join(archive, name))
    for name in sorted(os.listdir(staging)):
        atomic.move(os.path.join(staging, name), os.path.join(folder, name))
    os.rmdir(staging)
    return Resharded(epoch, archive, passed)


def _counters(state: dict) -> tuple[dict[str, dict], int]:
    """What a rank has counted: its communicator's per-tag counters and the samples it trained on."""
    return state["comm"], int(state.get("samples", 0))


def _archive_name(folder: str, old: int) -> str:
    path, n = os.path.join(folder, f"world-{old}"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(folder, f"world-{old}-{n}")
    return path
