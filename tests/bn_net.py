"""A small model with BatchNorm for tests (`--model tests.bn_net:build`): its running statistics are floating
buffers, which methods that average models must carry like parameters (DiLoCo averages them apart)."""

from __future__ import annotations

import math

from torch import nn


class BNNet(nn.Module):
    """Flatten, linear, BatchNorm, ReLU, linear: three parameter tensors before the norm's, two buffers."""

    def __init__(self, in_shape: tuple[int, ...], num_classes: int, width: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.BatchNorm1d(width), nn.ReLU())
        self.out = nn.Linear(width, num_classes)

    def features(self, x):
        return self.body(x)

    def head(self, features):
        return self.out(features)

    def forward(self, x):
        return self.head(self.features(x))


def build(in_shape, num_classes, width: int = 32) -> BNNet:
    return BNNet(tuple(in_shape), num_classes, width)
