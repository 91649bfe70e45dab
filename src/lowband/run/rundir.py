"""A run directory and every file in it, with one owner: `RunDir`.

    config.toml                 the resolved configuration
    placement.json              each local rank's device, the backend and why (comm/placement.py)
    train.log                   what the console showed
    tensorboard/, wandb/        experiment loggers' files (tensorboard/rank{R}/ for ranks R > 0)
    checkpoints/                rank{R}-epoch{E}.pt, resumable state (see checkpoint.py)
    pruned.txt                  a tuning trial that a comparison's pruner stopped early says so here
    model.safetensors           the final model (model.rank{R}.safetensors: rank R's own, when
                                ranks train separate models); model_L.safetensors the best local one
    NAME.jsonl, NAME.rank{R}.jsonl   record streams: metrics, rounds, distill, samples, ...
    .lowband.lock               held (flock) by the launcher while the run trains: a second launcher
                                for the same directory is refused (`held`)

A stream is a JSONL file of records that each carry an `epoch`. Rank 0's stream is NAME.jsonl
and rank R's NAME.rank{R}.jsonl, unless the stream is `per_rank`, when every rank (0 included)
has the suffix. On resume after epoch E, `cut_back(E)` drops every record past E from the
streams this rank owns, so a resumed run writes nothing twice.

Nothing here imports torch: the report and the coordinator read run directories cheaply.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

from lowband.atomic import write_text_atomic
from lowband.config import read_toml
from lowband.errors import UsageError
from lowband.paths import lock_holder, open_lock, writable_dir

CONFIG = "config.toml"
PLACEMENT = "placement.json"
LOCK = ".lowband.lock"


@contextlib.contextmanager
def held(path: str, field: str = "--run-dir") -> Iterator[None]:
    """Hold run directory `path` for one launcher while the run trains (an flock on its .lowband.lock,
    released when the launcher exits or dies); made if it does not exist, and removed again if it was
    made here and what runs inside fails before any record is written (a run stopped by Ctrl-C or SIGTERM
    once its config.toml is written keeps its folder: `--resume` continues it). Refused in one line naming
    `field` (lowband.paths): a directory another process holds, one that cannot be made or written (a
    file on the way, a read-only or immutable folder, /proc), a lock that is not a regular file."""
    made = not os.path.lexists(path)
    writable_dir(path, field)
    fd = open_lock(path, LOCK, field)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{field} {path} is in use by {lock_holder(fd)}; wait for it to end, or give "
                             "another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _check_kinds(path, field)
        yield
    except BaseException as e:
        run = RunDir(path)
        stopped = isinstance(e, KeyboardInterrupt) and os.path.exists(run.config_path)  # Ctrl-C, SIGTERM
        if made and not run.has_records() and not stopped:
            shutil.rmtree(path, ignore_errors=True)  # a run that never started leaves no directory
        raise
    finally:
        os.close(fd)  # the lock goes with it; the file stays (removing it would let two launchers lock two files)


def _check_kinds(path: str, field: str) -> None:
    """The run's own names hold what they should (checkpoints/ a directory, the records and config files),
    or nothing yet: one line now rather than a crash once the workers write there."""
    run = RunDir(path)
    wrong = [(p, "a directory") for p in (run.checkpoint_dir,) if os.path.lexists(p) and not os.path.isdir(p)]
    wrong += [(p, "a file") for p in (run.file("metrics.jsonl"), run.config_path, run.file("train.log"))
              if os.path.lexists(p) and not os.path.isfile(p)]
    if wrong:
        name, kind = wrong[0]
        raise UsageError(f"{field} {path}: {os.path.basename(name)} there is not {kind}; move it away, or give "
                         "another directory")


class Stream:
    """Appends JSON records to one file; creates it on the first write."""

    def __init__(self, path: str):
        self.path = path

    def write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def write_many(self, records: list[dict]) -> None:
        if records:
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)


class RunDir:
    """The files of one run directory, as seen by one rank (rank 0 for readers)."""

    def __init__(self, path: str, rank: int = 0):
        self.path, self.rank = path, rank

    def __repr__(self) -> str:
        return f"RunDir({self.path!r}, rank={self.rank})"

    def __fspath__(self) -> str:
        return self.path

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # ---- config ---------------------------------------------------------------------------------
    @property
    def config_path(self) -> str:
        return self.file(CONFIG)

    def is_run(self) -> bool:
        return os.path.isfile(self.config_path)

    def has_records(self) -> bool:
        return os.path.exists(self.stream_path("metrics", rank=0))

    def create(self) -> None:
        os.makedirs(self.path, exist_ok=True)

    def write_text(self, name: str, text: str, private: bool = False) -> None:
        """Write a file atomically (a temporary name, then a rename); `private`: its owner's alone (0600)."""
        write_text_atomic(self.file(name), text, private)

    def divergences(self) -> list[tuple[str, str]]:
        """(path, first line) of each diverged.rank{R}.txt a worker left (lowband.errors.Diverged)."""
        out = []
        for name in sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []:
            if name.startswith("diverged.rank") and name.endswith(".txt"):
                with open(self.file(name)) as f:
                    out.append((self.file(name), f.readline().strip()))
        return out

    def record_divergence(self, text: str) -> None:
        """diverged.rank{R}.txt: why this rank stopped (its first line is what the console says)."""
        self.write_text(f"diverged.rank{self.rank}.txt", text)

    def clear_divergences(self) -> None:
        """Remove the diverged.rank{R}.txt files of an earlier attempt (a resume starts afresh)."""
        for path, _ in self.divergences():
            os.remove(path)

    def record_pruned(self, text: str) -> None:
        """pruned.txt: a comparison's pruner stopped this tuning trial early, and why (lowband.comparison.tuning)."""
        self.write_text("pruned.txt", text)

    def record_placement(self, placement: dict) -> None:
        """placement.json: where the launcher put the workers and why (lowband.comm.placement's to_dict)."""
        self.write_text(PLACEMENT, json.dumps(placement, indent=2) + "\n")

    def placement(self) -> dict | None:
        """placement.json's record, or None: written by no launcher (an elastic job, an older run)."""
        path = self.file(PLACEMENT)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            return json.load(f)

    def pruned(self) -> str | None:
        """pruned.txt's text, or None: the run was not pruned."""
        path = self.file("pruned.txt")
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            return f.read().strip()

    def read_config_dict(self) -> dict[str, Any]:
        return read_toml(self.config_path, "run directory config")

    # ---- what people read besides the records ---------------------------------------------------
    @property
    def log_path(self) -> str:
        """train.log: what the console showed (rank 0's lines; an elastic job's workers all write it)."""
        return self.file("train.log")

    def logger_dir(self, name: str) -> str:
        """Where experiment logger `name` keeps its files (lowband.run.loggers): NAME/, or NAME/rankR/
        for rank R > 0 of a method whose ranks train separate models."""
        return self.file(name, *([f"rank{self.rank}"] if self.rank else []))

    # ---- checkpoints (their names: run/checkpoint.py) ---------------------------------------------
    @property
    def checkpoint_dir(self) -> str:
        return self.file("checkpoints")

    # ---- models ---------------------------------------------------------------------------------
    def model_path(self, rank: int = 0) -> str:
        """The final model of rank `rank`'s scope: model.safetensors for rank 0."""
        return self.file("model.safetensors" if rank == 0 else f"model.rank{rank}.safetensors")

    def local_model_path(self) -> str:
        return self.file("model_L.safetensors")

    # ---- record streams -------------------------------------------------------------------------
    def stream_path(self, name: str, rank: int | None = None, per_rank: bool = False) -> str:
        rank = self.rank if rank is None else rank
        return self.file(f"{name}.jsonl" if rank == 0 and not per_rank else f"{name}.rank{rank}.jsonl")

    def stream(self, name: str, per_rank: bool = False) -> Stream:
        """This rank's stream `name` (see the module docstring for the file name)."""
        return Stream(self.stream_path(name, per_rank=per_rank))

    def read(self, name: str, rank: int = 0, per_rank: bool = False) -> list[dict]:
        """Every record of a stream; [] when it does not exist."""
        return list(read_jsonl(self.stream_path(name, rank, per_rank)))

    def own_streams(self) -> list[str]:
        """Paths of the streams this rank writes: NAME.rank{R}.jsonl, and NAME.jsonl for rank 0."""
        mine = re.compile(rf"\.rank{self.rank}\.jsonl$")
        paths = [p for p in glob.glob(self.file("*.jsonl")) if mine.search(p)]
        if self.rank == 0:
            paths += [p for p in glob.glob(self.file("*.jsonl")) if not re.search(r"\.rank\d+\.jsonl$", p)]
        return sorted(paths)

    def cut_back(self, epoch: int) -> None:
        """Drop every record after `epoch` from this rank's streams (on resume)."""
        for path in self.own_streams():
            kept = [r for r in read_jsonl(path) if r.get("epoch", 0) <= epoch]
            write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def read_jsonl(path: str, check: Callable[[dict], str | None] | None = None) -> Iterator[dict]:
    """The records of a JSONL file, skipping any line that is not a JSON object (or that `check`
    finds fault with: it returns why) with one warning line naming the file and line."""
    if not os.path.isfile(path):
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            record, problem = _parse_line(raw)
            problem = problem or (check(record) if check else None)
            if problem:
                warn(f"skipping {path} line {number}: {problem}")
                continue
            yield record


def _parse_line(raw: bytes) -> tuple[dict, str | None]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except ValueError as e:
        return {}, f"not JSON ({e})"
    if not isinstance(record, dict):
        return {}, f"a JSON {type(record).__name__}, not an object"
    epoch = record.get("epoch", 0)
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)):  # rounds carry fractional epochs
        return {}, f"epoch {epoch!r} is not an integer (nor a fractional epoch)"
    return record, None


def warn(message: str) -> None:
    """One line on stderr (readers of damaged run directories skip what they can and say so)."""
    print(f"lowband: warning: {message}", file=sys.stderr)
