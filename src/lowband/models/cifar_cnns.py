"""Classic CIFAR CNNs: VGG-16 with batch norm, Network in Network, and the 13-layer CNN.

NiN (Lin et al. 2014) ends in a 1x1 convolution to the classes followed by global average
pooling; both are linear, so they commute: we pool first and apply the same map as `fc`, which
gives the same function and exposes the pooled 192-d vector as the features.
"""

from __future__ import annotations

from torch import nn

from lowband.models.base import Classifier
from lowband.registry import MODELS

VGG16_LAYERS: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


@MODELS.register("vgg16")
class VGG16(Classifier):
    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        layers: list[nn.Module] = []
        cin: int = in_shape[0]
        for v in VGG16_LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                width = int(v)
                layers += [nn.Conv2d(cin, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
                cin = width
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(512, num_classes)


def _mlpconv(cin: int, widths: tuple[int, int, int], kernel: int) -> list[nn.Module]:
    a, b, c = widths
    return [nn.Conv2d(cin, a, kernel, padding=kernel // 2), nn.ReLU(),
            nn.Conv2d(a, b, 1), nn.ReLU(), nn.Conv2d(b, c, 1), nn.ReLU()]


@MODELS.register("nin")
class NiN(Classifier):
    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(
            *_mlpconv(in_shape[0], (192, 160, 96), 5), nn.MaxPool2d(3, 2, 1), nn.Dropout(0.5),
            *_mlpconv(96, (192, 192, 192), 5), nn.AvgPool2d(3, 2, 1), nn.Dropout(0.5),
            nn.Conv2d(192, 192, 3, padding=1), nn.ReLU(), nn.Conv2d(192, 192, 1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.fc = nn.Linear(192, num_classes)


def _conv_bn(cin: int, cout: int, kernel: int, padding: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, padding=padding), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1)]


@MODELS.register("cnn13")
class CNN13(Classifier):
    """The 13-layer CNN of Laine & Aila 2017 / Tarvainen & Valpola 2017 (Mean Teacher)."""

    def __init__(self, cfg, in_shape, num_classes):
        super().__init__()
        c = in_shape[0]
        self.body = nn.Sequential(
            *_conv_bn(c, 128, 3, 1), *_conv_bn(128, 128, 3, 1), *_conv_bn(128, 128, 3, 1),
            nn.MaxPool2d(2), nn.Dropout(0.5),
            *_conv_bn(128, 256, 3, 1), *_conv_bn(256, 256, 3, 1), *_conv_bn(256, 256, 3, 1),
            nn.MaxPool2d(2), nn.Dropout(0.5),
            *_conv_bn(256, 512, 3, 0), *_conv_bn(512, 256, 1, 0), *_conv_bn(256, 128, 1, 0),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.fc = nn.Linear(128, num_classes)
