"""Learning-rate schedules as a pure function of the (fractional) epoch.

Warm-up follows Goyal et al. 2017: with linear scaling by s > 1 the rate ramps linearly from
the one-worker rate to s times it; with s = 1 it ramps from 0. After warm-up: constant, step
(times gamma at each milestone epoch) or cosine decay to 0 over the remaining epochs.
"""

from __future__ import annotations

import math

from lowband.config import OptimConfig


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
