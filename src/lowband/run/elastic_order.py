"""An elastic epoch's order: the trainer's per-rank orders laid out round by round (`EpochOrder`).

An epoch of an elastic job is one pass over one order of the training set; every round hands each
member the next slice of it (comm/membership.py's `decide`), so while the job's launched workers all
stay, member j's slice is exactly the trainer's rank j's next inner steps (run/elastic_worker.py).
"""

from __future__ import annotations

import torch

from lowband.config import Config
from lowband.data.loader import Batch
from lowband.run.trainer import WorkerData, rank_batches


def round_steps(method_cfg) -> int:
    """Inner steps between two rounds: tau, or tau / fragments for Streaming DiLoCo."""
    return method_cfg.tau // getattr(method_cfg, "fragments", 1)


class EpochOrder:
    """The order of an elastic epoch's samples, from the trainer's data plan for the job's launched
    workers (train.workers = K): each rank's shuffled shard, as the trainer's `Batches` takes it that
    epoch, is cut into runs of `per_worker` samples (one round's inner steps) and the runs are laid
    out round by round, rank 0 to K - 1 within a round. A quorum hands out consecutive slices of
    `per_worker` from a cursor (comm/membership.py's `decide`), so while the K launched workers all
    stay, member j's slice of a round is exactly the trainer's rank j's next inner steps; when the
    membership changes the slices are still disjoint pieces of the one order. An epoch has
    K x (the trainer's steps per epoch) x batch samples (the trainer leaves the same remainder out)."""

    def __init__(self, cfg: Config, plan: WorkerData, per_worker: int):
        self.data, self.per_worker = plan.data, per_worker
        self.sources = [rank_batches(cfg, plan, r, torch.device("cpu")) for r in range(cfg.train.workers)]
        self.per_rank = plan.steps * cfg.train.batch_size
        self.samples = self.per_rank * len(self.sources)
        # each position's place in its rank's epoch: how far the trainer's rank is when it takes it
        self.local = self._lay_out([torch.arange(self.per_rank)] * len(self.sources))
        self._epoch, self._ids = -1, torch.empty(0, dtype=torch.int64)

    def _lay_out(self, orders: list[torch.Tensor]) -> torch.Tensor:
        runs = [order.split(self.per_worker) for order in orders]
        return torch.cat([run for row in zip(*runs, strict=True) for run in row])

    def ids(self, epoch: int) -> torch.Tensor:
        """The sample ids of epoch `epoch` (0-based; the trainer's epoch epoch + 1) in order."""
        if epoch != self._epoch:
            self._epoch = epoch
            self._ids = self._lay_out([source.order(epoch + 1)[:self.per_rank] for source in self.sources])
        return self._ids

    def done(self, at: int) -> float:
        """The share of the epoch the trainer's rank has trained when it takes position `at`."""
        return int(self.local[at]) / self.per_rank

    def batch(self, ids: torch.Tensor) -> Batch:
        return Batch(self.data.x_train[ids], self.data.y_train[ids], ids)
