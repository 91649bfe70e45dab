"""Learning-rate schedules as a pure function of the (fractional) epoch.

Warm-up follows Goyal et al. 2017: with linear scaling by s > 1 the rate ramps linearly from
the one-worker rate to s times it; with s = 1 it ramps from 0. After warm-up: constant, step
(times gamma at each milestone epoch) or cosine decay to 0 over the remaining epochs.

`MethodSchedule` is the one place a run's rate comes from: the schedule with the method's own rules
(its linear-scaling width, its warm-up for optim.warmup_epochs = 'auto', its factor on the rate).
The trainer and the elastic worker both set their optimizer's rate through it.
"""

from __future__ import annotations

import math
from typing import Protocol

from lowband.config import Config, OptimConfig


def lr_at(epoch: float, cfg: OptimConfig, total_epochs: int, scale: float, warmup: float) -> float:
    peak = cfg.lr * (scale if cfg.lr_scaling == "linear" else 1.0)
    if epoch < warmup:
        start = cfg.lr if peak > cfg.lr else 0.0
        return start + (peak - start) * epoch / warmup
    if cfg.schedule == "step":
        return peak * cfg.gamma ** sum(epoch >= m for m in cfg.milestones)
    if cfg.schedule == "cosine":
        span = max(total_epochs - warmup, 1e-9)
        return peak * 0.5 * (1 + math.cos(math.pi * min((epoch - warmup) / span, 1.0)))
    return peak


class LrRules(Protocol):
    """What a method says about its learning rate (lowband.methods.base.Method has all three)."""

    def lr_scale(self) -> float: ...

    def lr_factor(self, done: float) -> float: ...

    def default_warmup_epochs(self) -> float: ...


class MethodSchedule:
    """A run's learning rate at a (fractional, 0-based) epoch: `lr_at` with the method's rules, asked
    at every call (scale, factor) as the trainer always has; warm-up 'auto' is the method's default."""

    def __init__(self, cfg: Config, method: LrRules):
        self.optim, self.epochs, self.method = cfg.optim, cfg.train.epochs, method
        warm = cfg.optim.warmup_epochs
        self.warmup = method.default_warmup_epochs() if warm == "auto" else float(warm)

    def at(self, epoch: float) -> float:
        factor = self.method.lr_factor(epoch / max(self.epochs, 1))
        return lr_at(epoch, self.optim, self.epochs, self.method.lr_scale(), self.warmup) * factor

    def apply(self, optimizer, epoch: float) -> None:
        """Set every parameter group's rate to the one at `epoch`."""
        lr = self.at(epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
