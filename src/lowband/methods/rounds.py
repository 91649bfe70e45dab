"""Per-round figures for methods that aggregate in rounds (MA-DNN, EC-DNN).

At a reported round every rank evaluates its local model, rank 0 evaluates the global model,
and the run's `rounds` stream (rounds.jsonl) gets: round, step, epoch, each local model's
validation accuracy, the global model's, and Diff_LG = mean local error - global error
(positive: the global model is better).
At most `round_evals` rounds are reported, evenly spaced, to bound the evaluation cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lowband.config import MethodConfig, opt


@dataclass(kw_only=True)
class RoundsConfig(MethodConfig):
    tau: int = opt(16, "local steps per communication round", bounds=">= 1")
    round_evals: int = opt(100, "report at most this many rounds (evenly spaced) in rounds.jsonl; 0: none",
                           bounds="0..100000")


class RoundLog:
    def __init__(self, ctx, tau: int, budget: int):
        self.ctx = ctx
        self.stream = ctx.run.stream("rounds")
        rounds = max(ctx.total_steps // tau, 1)
        self.every = math.ceil(rounds / budget) if budget else 0

    def due(self, round_no: int) -> bool:
        return bool(self.every) and round_no % self.every == 0

    def local_accuracies(self, local_model, comm=None) -> list[float]:
        """Every rank's local model's validation accuracy, over `comm` (the round's members; None: the run's)."""
        acc = torch.tensor([self.ctx.evaluate(local_model)], dtype=torch.float64, device=self.ctx.device)
        return [float(a) for a in (comm or self.ctx.comm).all_gather(acc, tag="metrics")]

    def write(self, round_no: int, step: int, local: list[float], global_model, comm=None, **extra) -> None:
        """The round's line, written by the first rank of `comm` (the round's source; None: the run's rank 0)."""
        if (comm or self.ctx.comm).rank != 0:
            return
        glob = self.ctx.evaluate(global_model)
        self.stream.write({"round": round_no, "step": step, "epoch": step / self.ctx.steps_per_epoch,
                              "local_acc": local, "global_acc": glob,
                              "diff_lg": glob - sum(local) / len(local), **extra})
