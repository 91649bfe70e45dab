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


COPIES = 3  # what a worker holds of its model at the least: weights, gradients and one optimizer state, fp32


def check_model(cfg: C.Config, data, workers: int = 1) -> None:
    """The model builds for `data`, and `workers` of it fit in this machine's memory, or one line saying
    they do not: first counted on the meta device (no memory: a model of 10^12 parameters is refused at
    once), then built once."""
    from lowband.models import build_for_task  # torch: reading a run's config need not load it

    if (count := _parameters(cfg, data)) is not None:
        _check_memory(cfg, count, workers)
    try:
        model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task)
    except (RuntimeError, MemoryError) as e:  # e.g. model.n_embd=10**12: the allocator refuses
        if "alloc" not in str(e) and not isinstance(e, MemoryError):
            raise
        raise UsageError(f"model.name={cfg.model.name!r} with these settings does not fit in this machine's memory "
                         f"({_allocation(e)}); make it smaller (model.size, n_layer, n_embd, context, "
                         "hidden)") from None
    METHODS.get(cfg.method.name).check_model(cfg.method, model)


def _parameters(cfg: C.Config, data) -> int | None:
    """The model's parameter count, built on the meta device; None when it cannot be built there (a factory
    of the user's that computes on its tensors): the real build then judges it."""
    import torch

    from lowband.models import build_for_task

    try:
        with torch.device("meta"):
            model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 - any failure here is the real build's to report
        return None


def _check_memory(cfg: C.Config, count: int, workers: int) -> None:
    """Refuse a model whose `workers` copies (COPIES each; one, the launcher's, when they train on GPUs: the
    placement's decision) need more than this machine's available memory."""
    from lowband.comm.placement import here  # torch: reading a run's config need not load it

    gpus = here(cfg.train.device, cfg.train.backend, workers).device == "cuda"
    need, free = 4 * COPIES * count * (1 if gpus else workers), available_memory()
    if free is not None and need > free:
        raise UsageError(f"model.name={cfg.model.name!r} with these settings does not fit in this machine's memory: "
                         f"{count:,} parameters, at least {need / 2**30:,.1f} GiB for {workers} worker(s) (weights, "
                         f"gradients and an optimizer state in fp32) against {free / 2**30:,.1f} GiB available; "
                         "make it smaller (model.size, n_layer, n_embd, context, hidden) or use fewer workers")


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's MemAvailable); None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            found = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def _allocation(error: BaseException) -> str:
    """The allocator's words for a refused allocation: 'you tried to allocate N bytes'."""
    found = re.search(r"tried to allocate \d+ bytes", str(error))
    return found.group(0) if found else str(error).splitlines()[0][:90]


