"""A run's config.toml and its directory: made once by the launcher, read by every reader.

Below the session (training/session.py) so that what starts or joins a run of any kind (a job of K
workers, an elastic job, a worker that joins one) reads configs and prepares directories one way.
"""

from __future__ import annotations

import os
import re
import time

from lowband import config as C
from lowband.catalog import load_all
from lowband.errors import ConfigError, UsageError
from lowband.registry import METHODS
from lowband.run.rundir import RunDir


def method_configs() -> dict[str, type]:
    load_all()
    return {name: METHODS.get(name).Config for name in METHODS.names()}


def new_run_dir(out: str, method: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(out, f"{method}-{stamp}"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(out, f"{method}-{stamp}-{n}")
    return path


def given_flag(run_dir: str | None, resume: bool) -> str:
    """The flag that named the run directory, for a line that refuses it: --resume, --run-dir, or --out (the
    folder a new run directory is made in)."""
    return "--resume" if resume else "--run-dir" if run_dir else "--out"


def prepare_run_dir(cfg: C.Config, run_dir: str) -> None:
    run = RunDir(run_dir)
    if run.has_records():
        raise ConfigError("--run-dir", run_dir, "holds a run already; continue it with --resume or pick a new directory")
    run.create()
    write_config(cfg, run_dir)


def write_config(cfg: C.Config, run_dir: str) -> None:
    RunDir(run_dir).write_text("config.toml", C.to_toml(cfg))


def read_run_config(run_dir: str, asked_by: str = "--resume") -> C.Config:
    """A run's config.toml; `asked_by` names the option or argument that gave `run_dir`, for the error."""
    run = RunDir(run_dir)
    if not run.is_run():
        raise ConfigError(asked_by, run_dir, "not a run directory (no config.toml)")
    return C.from_dict(C.read_toml(run.config_path, asked_by), method_configs())


def check_model(cfg: C.Config, data) -> None:
    """The model builds for `data` in this machine's memory, or one line saying it does not."""
    from lowband.models import build_for_task  # torch: reading a run's config need not load it

    try:
        model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task)
    except (RuntimeError, MemoryError) as e:  # e.g. model.n_embd=10**12: the allocator refuses
        if "alloc" not in str(e) and not isinstance(e, MemoryError):
            raise
        raise UsageError(f"model.name={cfg.model.name!r} with these settings does not fit in this machine's memory "
                         f"({_allocation(e)}); make it smaller (model.size, n_layer, n_embd, context, "
                         "hidden)") from None
    METHODS.get(cfg.method.name).check_model(cfg.method, model)


def _allocation(error: BaseException) -> str:
    """The allocator's words for a refused allocation: 'you tried to allocate N bytes'."""
    found = re.search(r"tried to allocate \d+ bytes", str(error))
    return found.group(0) if found else str(error).splitlines()[0][:90]


