"""Experiment loggers (TensorBoard, Weights & Biases) as plug-ins of the epoch reporter.

`train.loggers` names them (`--logger tensorboard --logger wandb`); the reporter's leader
builds them, hands each epoch's record to every one as flat scalars (`scalars`) and closes them
at the end. metrics.jsonl stays the source of truth: a logger only mirrors it.

A logger is any object with `log(scalars: dict[str, float], epoch: int)` and `close()`, built by
a factory called as `factory(run_dir=..., rank=..., config=...)` (config: the resolved config as
a plain dict). Besides the built-in names, `train.loggers` takes `package.module:factory`.
Neither package is a dependency of lowband: each is imported only when asked for, and a missing
one stops the command before any worker starts (`check`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any, Protocol

from lowband.errors import ConfigError
from lowband.registry.plugins import import_factory

# built-in logger name -> (package it needs, pip install hint)
PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"), "wandb": ("wandb", "pip install wandb")}


class Logger(Protocol):
    def log(self, scalars: dict[str, float], epoch: int) -> None: ...

    def close(self) -> None: ...


def check(names: list[str]) -> None:
    """Raise a ConfigError (one line, exit 2) for an unknown logger or one whose package is missing."""
    for name in names:
        if ":" in name:
            import_factory(name, "train.loggers")
            continue
        if name not in PACKAGES:
            raise ConfigError("train.loggers", name, "unknown logger; known: " + ", ".join(PACKAGES)
                              + " (or package.module:factory)")
        package, hint = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError("train.loggers", name, f"needs the {package} package, which is not installed "
                                                     f"(`{hint}`)")


def build(names: list[str], run_dir: str, rank: int, config: dict) -> list[Logger]:
    """The loggers `names`, writing for the scope led by `rank` of the run in `run_dir`."""
    return [_factory(name)(run_dir=run_dir, rank=rank, config=config) for name in names]


def _factory(name: str) -> Callable[..., Logger]:
    if ":" in name:
        return import_factory(name, "train.loggers")
    known: dict[str, Callable[..., Logger]] = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}
    return known[name]




def scalars(record: dict) -> dict[str, float | None]:
    """One epoch record as flat scalars: losses, accuracies, lr, bytes per tag, seconds, method extras."""
    out: dict[str, float | None] = {"loss/train": record.get("train_loss")}
    for key in ("val_acc", "test_acc", "val_acc_L", "test_acc_L"):
        out[f"accuracy/{key}"] = record.get(key)
    for key in ("val_loss", "test_loss", "val_bpb", "test_bpb"):
        out[f"loss/{key}"] = record.get(key)
    out["lr"] = record.get("lr")
    out["samples_per_s"] = record.get("samples_per_s")
    out["bytes/sent_per_worker"] = record.get("bytes_sent_per_worker")
    out["bytes/recv_per_worker"] = record.get("bytes_recv_per_worker")
    for tag, b in (record.get("bytes") or {}).items():
        out[f"bytes/{tag}/sent"], out[f"bytes/{tag}/recv"] = b.get("sent"), b.get("recv")
    for key, value in (record.get("time") or {}).items():
        out[f"seconds/{key.removesuffix('_s')}"] = value
    known = {"epoch", "samples", "steps", "train_loss", "lr", "samples_per_s", "time", "bytes", "bytes_total",
             "bytes_sent_per_worker", "bytes_recv_per_worker", "reached_target_epoch",
             "val_acc", "test_acc", "val_acc_L", "test_acc_L", "val_loss", "test_loss", "val_bpb", "test_bpb"}
    for key, value in record.items():  # method extras (Diff_LG, buffer volume, ...): numbers only
        if key not in known and not key.endswith("_ranks"):
            out[f"method/{key}"] = value
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardLogger:
    """Event files under RUN_DIR/tensorboard (rank R of a method with separate models: .../rankR)."""

    def __init__(self, run_dir: str, rank: int, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        folder = os.path.join(run_dir, "tensorboard", *([f"rank{rank}"] if rank else []))
        self.writer = SummaryWriter(log_dir=folder)
        self.writer.add_text("config", "```\n" + _toml(config) + "\n```", 0)

    def log(self, scalars: dict[str, float], epoch: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run in RUN_DIR/wandb, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it)."""

    def __init__(self, run_dir: str, rank: int, config: dict):
        import wandb

        name = os.path.basename(os.path.normpath(run_dir)) + (f"-rank{rank}" if rank else "")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lowband"), name=name, dir=run_dir,
                              config=config, mode=os.environ.get("WANDB_MODE", "offline"), reinit=True)

    def log(self, scalars: dict[str, float], epoch: int) -> None:
        self.run.log({"epoch": epoch, **scalars}, step=epoch)

    def close(self) -> None:
        self.run.finish()


def _toml(config: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(config)
