"""The in-memory data set container and the cached loader behind `data.name`."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

from lowband.config import DataConfig
from lowband.registry import DATASETS


@dataclass
class TensorData:
    """A whole data set as tensors: x float32 (N, *in_shape), y int64 (N,)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).contiguous() for k in ("x_train", "y_train", "x_test", "y_test")}


def cache_dir(cfg: DataConfig) -> str:
    return cfg.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "lowband")


def _cache_path(cfg: DataConfig) -> str:
    key = json.dumps({"name": cfg.name, "n": cfg.num_samples, "v": 1}, sort_keys=True)
    return os.path.join(cache_dir(cfg), f"{cfg.name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.safetensors")


def load_dataset(cfg: DataConfig) -> TensorData:
    """Load `cfg.name`; data sets that are generated (not read from disk) are cached."""
    loader = DATASETS.get(cfg.name)
    if not getattr(loader, "cached", False):
        return loader(cfg)
    path = _cache_path(cfg)
    try:
        t = load_file(path)
        return TensorData(t["x_train"], t["y_train"], t["x_test"], t["y_test"], int(t["num_classes"].item()))
    except Exception:  # absent or damaged cache: regenerate
        data = loader(cfg)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    save_file({**data.tensors(), "num_classes": torch.tensor(data.num_classes)}, tmp)
    os.replace(tmp, path)
    return data
