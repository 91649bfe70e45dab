"""Checkpoints that a crash cannot leave half-written, loaded without unpickling code.

Resumable state goes to checkpoints/rank{R}-epoch{E}.pt (torch.save, read back with
weights_only=True); the final model to model.safetensors. Every write goes to a temporary name
in the same directory and is renamed into place, so a reader sees the old file or the new one.
"""

from __future__ import annotations

import os
import re

import torch
from safetensors.torch import save_file

from lowband.errors import UsageError

KEEP = 2  # resumable checkpoints kept per rank


def _atomic(path: str, write) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_state(state: dict, path: str) -> None:
    _atomic(path, lambda tmp: torch.save(state, tmp))


def load_state(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from None


def save_model(state_dict: dict, path: str) -> None:
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()}
    _atomic(path, lambda tmp: save_file(tensors, tmp))


def rank_path(run_dir: str, rank: int, epoch: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"rank{rank}-epoch{epoch:04d}.pt")


def epochs_saved(run_dir: str, rank: int) -> list[int]:
    folder = os.path.join(run_dir, "checkpoints")
    pattern = re.compile(rf"rank{rank}-epoch(\d+)\.pt$")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def latest_common_epoch(run_dir: str, world: int) -> int:
    """The newest epoch for which every rank has a checkpoint (0: none)."""
    common = set(epochs_saved(run_dir, 0))
    for rank in range(1, world):
        common &= set(epochs_saved(run_dir, rank))
    return max(common, default=0)


def prune(run_dir: str, rank: int, keep: int = KEEP) -> None:
    for epoch in epochs_saved(run_dir, rank)[:-keep]:
        os.remove(rank_path(run_dir, rank, epoch))
