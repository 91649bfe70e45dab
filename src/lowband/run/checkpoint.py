"""Checkpoints that a crash cannot leave half-written, loaded without unpickling code.

Resumable state goes to checkpoints/rank{R}-epoch{E}.pt (torch.save, read back with
weights_only=True), each with a sidecar rank{R}-epoch{E}.pt.sha256 holding the file's SHA-256, written
before the checkpoint takes its name (a checkpoint in view is sealed);
resume uses the newest epoch whose files every rank has and whose checksums match (`resumable_epoch`);
the newest KEEP of each rank's are kept. An elastic job has one state, not one per worker: the round's
source writes it as rank 0's file, and the job resumes from rank 0's newest intact one (`newest_intact`).
The final model goes to model.safetensors. Every write goes to a temporary name in the same
directory and is renamed into place, so a reader sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle  # the error type of a refused checkpoint only: nothing is unpickled here
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lowband.atomic import write_atomic, write_text_atomic
from lowband.errors import UsageError
from lowband.run.rundir import RunDir

KEEP = 2  # resumable checkpoints kept per rank


SIDECAR = ".sha256"


def file_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_state(state: dict, path: str) -> None:
    """Write resumable state and its checksum sidecar, the sidecar first: a checkpoint under its final name is
    sealed (one without a sidecar is never resumed from). A write the system refuses (a full disk, the
    file-size limit, a read-only file system) is one line naming the file; the checkpoint before it stays."""
    def write(tmp: str) -> None:
        torch.save(state, tmp)
        write_text_atomic(path + SIDECAR, file_digest(tmp) + "\n")

    try:
        write_atomic(path, write)
    except (OSError, RuntimeError) as e:
        raise UsageError(f"could not write the checkpoint {path} ({why_unwritten(e)}); the one before it is kept: "
                         "free space or raise the limit, then --resume") from None


def tidy(run_dir: str) -> list[str]:
    """After a run finished: remove from checkpoints/ what a killed writer left (a `.tmp-PID` whose writer no
    longer runs, a checkpoint whose checksum sidecar was never written, a sidecar without its checkpoint):
    none of it could ever be resumed from. The names removed."""
    from lowband.atomic import process_running

    folder = RunDir(run_dir).checkpoint_dir
    if not os.path.isdir(folder):
        return []
    names = set(os.listdir(folder))
    gone = []
    for name in sorted(names):
        base, _, pid = name.rpartition(".tmp-")
        orphan = bool(base) and pid.isdigit() and not process_running(int(pid))
        unsealed = name.endswith(".pt") and name + SIDECAR not in names
        widowed = name.endswith(".pt" + SIDECAR) and name[:-len(SIDECAR)] not in names
        if orphan or unsealed or widowed:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
                gone.append(name)
    return gone


def why_unwritten(e: BaseException) -> str:
    """A write's failure in words: the system's reason (a full disk, the file-size limit), not torch's C++ frame."""
    code = getattr(e, "errno", None)
    if code == errno.ENOSPC or "No space left" in str(e):
        return "the disk is full"
    if code == errno.EFBIG or "enforce fail" in str(e) or "File too large" in str(e):
        return "the file-size limit (ulimit -f) or a full disk stopped it"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return os.strerror(code or 0).lower()
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def damage(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be trusted (None: it is intact)."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return f"{name} is missing or not a regular file"
    try:
        with open(path + SIDECAR) as f:
            expected = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return f"{name} has no readable checksum file"
    if file_digest(path) != expected:
        return f"{name} does not match its checksum (damaged or truncated)"
    return None


def load_state(path: str) -> dict:
    """A checkpoint's state, read without unpickling code (weights_only); anything else is one line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # torch's advice beside it suggests unpickling: not taken, not shown
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise UsageError(f"checkpoint {path} holds an object that only unpickling code would rebuild{what}; "
                         "lowband loads tensors and plain values only, so it is refused") from None
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"checkpoint {path} is unreadable ({type(e).__name__}: {first})") from None


def save_model(state_dict: dict, path: str, metadata: dict[str, str] | None = None) -> None:
    """A model as safetensors, with `metadata` (strings) in its header, readable like every other
    run file (safetensors itself creates files 0600)."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state_dict.items()}

    def write(tmp: str) -> None:
        save_file(tensors, tmp, metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)

    write_atomic(path, write)


def model_metadata(path: str) -> dict[str, str]:
    """The metadata in a safetensors file's header ({} when it has none or cannot be read)."""
    try:
        with safe_open(path, "pt") as f:
            return dict(f.metadata() or {})
    except Exception:  # noqa: BLE001 - a damaged file has no usable metadata; loading it says why
        return {}


def rank_name(rank: int, epoch: int) -> str:
    """A rank's checkpoint file name: rank{R}-epoch{EEEE}.pt."""
    return f"rank{rank}-epoch{epoch:04d}.pt"


def rank_path(run_dir: str, rank: int, epoch: int) -> str:
    return os.path.join(RunDir(run_dir).checkpoint_dir, rank_name(rank, epoch))


def epochs_saved(run_dir: str, rank: int) -> list[int]:
    folder = RunDir(run_dir).checkpoint_dir
    pattern = re.compile(rf"rank{rank}-epoch(\d+)\.pt$")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def ranks_saved(run_dir: str) -> list[int]:
    """Every rank that has at least one resumable checkpoint in the run."""
    folder = RunDir(run_dir).checkpoint_dir
    pattern = re.compile(r"rank(\d+)-epoch\d+\.pt$")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted({int(m.group(1)) for m in map(pattern.match, names) if m})


def latest_common_epoch(run_dir: str, world: int) -> int:
    """The newest epoch for which every rank has a checkpoint (0: none)."""
    common = set(epochs_saved(run_dir, 0))
    for rank in range(1, world):
        common &= set(epochs_saved(run_dir, rank))
    return max(common, default=0)


def resumable_epoch(run_dir: str, ranks: list[int]) -> tuple[int, list[str]]:
    """The newest epoch that every rank in `ranks` has an intact checkpoint of (0: none), and why
    each newer epoch that every rank saved was passed over."""
    common = set(epochs_saved(run_dir, ranks[0]))
    for rank in ranks[1:]:
        common &= set(epochs_saved(run_dir, rank))
    passed: list[str] = []
    for epoch in sorted(common, reverse=True):
        problems = [p for p in (damage(rank_path(run_dir, r, epoch)) for r in ranks) if p]
        if not problems:
            return epoch, passed
        passed += problems
    return 0, passed


def adopt_old_job_checkpoints(run_dir: str) -> list[str]:
    """Rename an elastic job's checkpoints of the layout before rank 0's (elastic-epoch{E}.pt, lowband up to
    stop 50) to rank 0's names, sidecars included (a checksum is of the bytes, not the name); the new names.
    Nothing is renamed once the job has rank 0's checkpoints, nor onto anything in the way."""
    folder = RunDir(run_dir).checkpoint_dir
    names = os.listdir(folder) if os.path.isdir(folder) else []
    found = sorted((m for m in map(re.compile(r"elastic-epoch(\d+)\.pt$").match, names) if m), key=lambda m: int(m[1]))
    if epochs_saved(run_dir, 0):  # the job already has rank 0's checkpoints: an old file never replaces one
        return []
    renamed = []
    for m in found:
        new = rank_path(run_dir, 0, int(m.group(1)))
        if os.path.exists(new):  # not a file to replace (a directory in its way): left as it is
            continue
        for suffix in ("", SIDECAR):
            if os.path.exists(os.path.join(folder, m.group(0) + suffix)):
                os.replace(os.path.join(folder, m.group(0) + suffix), new + suffix)
        renamed.append(os.path.basename(new))
    return renamed


def newest_intact(run_dir: str, rank: int = 0) -> tuple[str | None, list[str]]:
    """`rank`'s newest intact checkpoint (None: none) and why each newer one was passed over: what an
    elastic job resumes from, its rank 0's file being the job's."""
    epoch, passed = resumable_epoch(run_dir, [rank])
    return (rank_path(run_dir, rank, epoch) if epoch else None), passed


def prune(run_dir: str, rank: int, keep: int = KEEP) -> None:
    for epoch in epochs_saved(run_dir, rank)[:-keep]:
        path = rank_path(run_dir, rank, epoch)
        os.remove(path)
        if os.path.exists(path + SIDECAR):
            os.remove(path + SIDECAR)
