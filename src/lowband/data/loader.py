"""A worker's stream of training minibatches from its shard, reshuffled each epoch."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lowband.data.base import TensorData


@dataclass(frozen=True)
class Batch:
    """One minibatch: inputs, labels, their indices into the training set, and (when a teacher
    answered) the teacher's logits for the same samples."""

    x: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor
    logits: torch.Tensor | None = None

    def with_logits(self, logits: torch.Tensor) -> Batch:
        return replace(self, logits=logits)


class Batches:
    """Yields `steps` minibatches per epoch from `indices`; order depends only on (seed, epoch)."""

    def __init__(self, data: TensorData, indices: torch.Tensor, batch_size: int, steps: int,
                 seed: int, augment: bool = False, device: torch.device | None = None):
        self.data, self.indices, self.batch_size, self.steps = data, indices, batch_size, steps
        self.seed, self.augment = seed, augment
        self.device = device or torch.device("cpu")

    def _generator(self, epoch: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's sample ids in the order `epoch` takes them (its first steps x batch_size)."""
        return self.indices[torch.randperm(len(self.indices), generator=self._generator(epoch))]

    def epoch(self, epoch: int):
        """The epoch's minibatches (`Batch`es); `ids` are indices into the training set."""
        gen = self._generator(epoch)
        order = self.indices[torch.randperm(len(self.indices), generator=gen)]
        for step in range(self.steps):
            ids = order[step * self.batch_size:(step + 1) * self.batch_size]
            x = self.data.x_train[ids]
            if self.augment:
                x = crop_flip(x, gen)
            yield Batch(x.to(self.device), self.data.y_train[ids].to(self.device), ids)


def crop_flip(x: torch.Tensor, gen: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Random crop after zero padding, and random horizontal flip, for (N, C, H, W) images."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(h))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w))[:, None, None, :]
    out = padded[torch.arange(n)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None], rows, cols]
    flip = torch.rand(n, generator=gen) < 0.5
    out[flip] = out[flip].flip(-1)
    return out
