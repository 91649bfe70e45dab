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
from lowband.records import EpochRecord
from lowband.registry.plugins import import_factory
from lowband.run.rundir import RunDir

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




def scalars(record: EpochRecord) -> dict[str, float]:
    """One epoch record as flat scalars: losses, accuracies, lr, bytes per tag, seconds, method extras."""
    r = record
    out: dict[str, object] = {
        "loss/train": r.train_loss, "accuracy/val_acc": r.val_acc, "accuracy/test_acc": r.test_acc,
        "accuracy/val_acc_L": r.val_acc_L, "accuracy/test_acc_L": r.test_acc_L,
        "loss/val_loss": r.val_loss, "loss/test_loss": r.test_loss, "loss/val_bpb": r.val_bpb,
        "loss/test_bpb": r.test_bpb, "lr": r.lr, "samples_per_s": r.samples_per_s,
        "bytes/sent_per_worker": r.bytes_sent_per_worker, "bytes/recv_per_worker": r.bytes_recv_per_worker}
    for tag, b in r.bytes.items():
        out[f"bytes/{tag}/sent"], out[f"bytes/{tag}/recv"] = b.get("sent"), b.get("recv")
    for key, value in r.time.items():
        out[f"seconds/{key.removesuffix('_s')}"] = value
    out["method/bytes_inter_per_worker"], out["method/corpus_bytes"] = r.bytes_inter_per_worker, r.corpus_bytes
    for key, value in r.extra.items():  # method extras (Diff_LG, buffer volume, ...): numbers only
        if not key.endswith("_ranks"):
            out[f"method/{key}"] = value
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardLogger:
    """Event files under RUN_DIR/tensorboard (rank R of a method with separate models: .../rankR)."""

    def __init__(self, run_dir: str, rank: int, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=RunDir(run_dir, rank).logger_dir("tensorboard"))
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
        # wandb makes its own wandb/ folder under `dir`: RUN_DIR/wandb, as RunDir says
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lowband"), name=name, dir=run_dir,
                              config=config, mode=os.environ.get("WANDB_MODE", "offline"), reinit=True)

    def log(self, scalars: dict[str, float], epoch: int) -> None:
        self.run.log({"epoch": epoch, **scalars}, step=epoch)

    def close(self) -> None:
        self.run.finish()


def _toml(config: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(config)
