"""Small models for the small data sets: an MLP, the MNIST-1D paper's ConvBase, and a small 2D CNN."""

from __future__ import annotations

import math

import torch
from torch import nn

from lowband.errors import ConfigError
from lowband.models.base import Classifier
from lowband.registry import MODELS


@MODELS.register("mlp")
class MLP(Classifier):
    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        h = cfg.hidden
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), h), nn.ReLU(),
                                  nn.Linear(h, h), nn.ReLU())
        self.fc = nn.Linear(h, num_classes)


@MODELS.register("cnn1d")
class ConvBase1d(Classifier):
    """ConvBase of the MNIST-1D paper (Greydanus 2020): three strided 1D convolutions, then linear."""

    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        channels = cfg.channels
        if len(in_shape) != 2:
            raise ConfigError("model.name", "cnn1d", f"needs 1D signals (C, L); the data gives {tuple(in_shape)}")
        self.body = nn.Sequential(
            nn.Conv1d(in_shape[0], channels, 5, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            width = self.body(torch.zeros(1, *in_shape)).shape[1]
        self.fc = nn.Linear(width, num_classes)


@MODELS.register("cnn2d")
class SmallCNN2d(Classifier):
    """Two 3x3 conv blocks with max pooling, an adaptive pool, and a 128-wide hidden layer."""

    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        if len(in_shape) != 3:
            raise ConfigError("model.name", "cnn2d", f"needs images (C, H, W); the data gives {tuple(in_shape)}")
        self.body = nn.Sequential(
            nn.Conv2d(in_shape[0], 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(256, 128), nn.ReLU(),
        )
        self.fc = nn.Linear(128, num_classes)
