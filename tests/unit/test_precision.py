"""train.precision = "bf16": the forward pass under autocast, the weights and the loss in fp32. The tiny GPT's
loss over one epoch of KJV windows, and its held-out loss after it, within 1% of fp32's from the same start
and the same batches (the reference: the same steps in fp32)."""

from __future__ import annotations

import pytest
import torch

from lowband.config import DataConfig
from lowband.data import Batch
from lowband.data.base import load_dataset
from lowband.models.gpt import GPT, SIZES
from lowband.training.trainer import scores, train_step

pytestmark = pytest.mark.unit


class Plain:
    """The method hooks of a single worker: the task loss, nothing around the step."""

    def loss(self, batch, outputs, task):
        return task

    def after_backward(self, step):
        pass

    def after_step(self, step):
        pass


def one_epoch(precision: str, data, steps: int, batch: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = GPT(256, data.x_train.shape[1], SIZES["tiny"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.004, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        i = torch.arange(step * batch, (step + 1) * batch)
        b = Batch(data.x_train[i], data.y_train[i], i)
        losses.append(train_step(model, Plain(), opt, b, step, precision=precision))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay fp32
    return sum(losses) / len(losses), scores(model, data.x_val[:64], data.y_val[:64], 64, "cpu")[1]


def test_a_bf16_epoch_tracks_the_fp32_epoch_within_one_percent():
    data = load_dataset(DataConfig(name="text", max_bytes=40_000, context=32))
    steps, batch = 12, 8  # 96 windows of the training split, each once
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker trains (and 2 cores shared by the suite's processes)
    try:
        fp32_train, fp32_val = one_epoch("fp32", data, steps, batch)
        bf16_train, bf16_val = one_epoch("bf16", data, steps, batch)
    finally:
        torch.set_num_threads(threads)
    assert bf16_train == pytest.approx(fp32_train, rel=0.01)
    assert bf16_val == pytest.approx(fp32_val, rel=0.01)
    assert bf16_train != fp32_train  # bf16 did run: the rounding differs
