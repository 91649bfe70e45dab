"""CIFAR ResNets (He et al. 2016, section 4.2): 6n+2 layers, widths 16/32/64, projection shortcuts."""

from __future__ import annotations

from torch import nn

from lowband.models.base import Classifier
from lowband.registry import MODELS


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        return (self.bn2(self.conv2(out)) + self.short(x)).relu()


class CifarResNet(Classifier):
    def __init__(self, depth: int, in_shape, num_classes):
        super().__init__()
        n = (depth - 2) // 6
        layers = [nn.Conv2d(in_shape[0], 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for i in range(n):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)


@MODELS.register("resnet20")
def resnet20(cfg, in_shape, num_classes):
    return CifarResNet(20, in_shape, num_classes)


@MODELS.register("resnet32")
def resnet32(cfg, in_shape, num_classes):
    return CifarResNet(32, in_shape, num_classes)
