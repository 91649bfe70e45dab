"""An elastic epoch's order: the trainer's per-rank orders laid out round by round (`EpochOrder`).

An epoch of an elastic job is one pass over one order of the training set; every round hands each
member the next slice of it (comm/membership.py's `decide`), so while the job's launched workers all
stay, member j's slice is exactly the trainer's rank j's inner steps up to its method's next outer step
(training/elastic/worker.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lowband.config import Config
from lowband.data.loader import Batch
from lowband.training.trainer import WorkerData, rank_batches


def runs(next_sync: Callable[[int], int], start: int, length: int) -> list[int]:
    """The lengths of the stretches between stops in the `length` steps from `start`: the method's outer
    steps (`next_sync(s)`: the first after step s) and the end."""
    cuts, s = [], start
    while (n := next_sync(s)) < start + length:
        cuts.append(n - s)
        s = n
    return cuts + [start + length - s]


class EpochOrder:
    """The order of an elastic epoch's samples, from the trainer's data plan for the job's launched
    workers (train.workers = K): each rank's shuffled shard, as the trainer's `Batches` takes it that
    epoch, is cut where the method's outer steps fall in `lowband train` (`next_sync`, from the epoch's
    first step, epoch x the trainer's steps per epoch), and the stretches are laid out round by round,
    rank 0 to K - 1 within a round. A quorum hands out consecutive slices from a cursor, the same number
    of steps to every member, so while the K launched workers all stay, member j's slice of a round is
    exactly the trainer's rank j's next inner steps; when the membership changes the slices are still
    disjoint pieces of the one order. An epoch has K x (the trainer's steps per epoch) x batch samples
    (the trainer leaves the same remainder out)."""

    def __init__(self, cfg: Config, plan: WorkerData, next_sync: Callable[[int], int]):
        self.data, self.bs, self.steps, self.next_sync = plan.data, cfg.train.batch_size, plan.steps, next_sync
        self.sources = [rank_batches(cfg, plan, r, torch.device("cpu")) for r in range(cfg.train.workers)]
        self.per_rank = plan.steps * cfg.train.batch_size
        self.samples = self.per_rank * len(self.sources)
        self._epoch, self._ids, self._local = -1, torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)

    def _lay_out(self, orders: list[torch.Tensor], epoch: int) -> torch.Tensor:
        lengths = [n * self.bs for n in runs(self.next_sync, epoch * self.steps, self.steps)]
        cut = [order.split(lengths) for order in orders]
        return torch.cat([run for row in zip(*cut, strict=True) for run in row])

    def _at(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch = epoch
            self._ids = self._lay_out([source.order(epoch + 1)[:self.per_rank] for source in self.sources], epoch)
            # each position's place in its rank's epoch: how far the trainer's rank is when it takes it
            self._local = self._lay_out([torch.arange(self.per_rank)] * len(self.sources), epoch)

    def ids(self, epoch: int) -> torch.Tensor:
        """The sample ids of epoch `epoch` (0-based; the trainer's epoch epoch + 1) in order."""
        self._at(epoch)
        return self._ids

    def done(self, epoch: int, at: int) -> float:
        """The share of epoch `epoch` the trainer's rank has trained when it takes position `at`."""
        self._at(epoch)
        return int(self._local[at]) / self.per_rank

    def batch(self, ids: torch.Tensor) -> Batch:
        return Batch(self.data.x_train[ids], self.data.y_train[ids], ids)
