"""Image data sets read from a directory the user already has: CIFAR-10/100 and ImageFolder."""

from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from lowband.config import DataConfig
from lowband.data.base import TensorData
from lowband.errors import ConfigError, require
from lowband.registry import DATASETS

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


class _ArraysOnly(pickle.Unpickler):
    """Unpickles the CIFAR batch files (dicts of lists, bytes and numpy arrays) and nothing else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)


def _find(root: str, names: list[str]) -> str:
    for sub in ("", "cifar-10-batches-py", "cifar-100-python"):
        if all(os.path.isfile(os.path.join(root, sub, n)) for n in names):
            return os.path.join(root, sub)
    raise ConfigError("data.root", root, f"expected the files {', '.join(names)} (python-pickle CIFAR format)")


def _read_batches(folder: str, names: list[str], label_key: bytes):
    xs, ys = [], []
    for n in names:
        with open(os.path.join(folder, n), "rb") as f:
            d = _ArraysOnly(f, encoding="bytes").load()
        xs.append(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[label_key], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _normalized(x_tr: np.ndarray, x_te: np.ndarray):
    tr = torch.as_tensor(x_tr, dtype=torch.float32) / 255.0
    te = torch.as_tensor(x_te, dtype=torch.float32) / 255.0
    mean, std = tr.mean(dim=(0, 2, 3), keepdim=True), tr.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return (tr - mean) / std, (te - mean) / std


def _cifar(cfg: DataConfig, train: list[str], test: list[str], key: bytes, classes: int) -> TensorData:
    require(bool(cfg.root) and os.path.isdir(cfg.root), "data.root", cfg.root,
            f"an existing directory holding {cfg.name} in the python-pickle format")
    folder = _find(cfg.root, train + test)
    x_tr, y_tr = _read_batches(folder, train, key)
    x_te, y_te = _read_batches(folder, test, key)
    tr, te = _normalized(x_tr, x_te)
    return TensorData(tr, torch.as_tensor(y_tr), te, torch.as_tensor(y_te), classes)


@DATASETS.register("cifar10")
def cifar10(cfg: DataConfig) -> TensorData:
    return _cifar(cfg, [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10)


@DATASETS.register("cifar100")
def cifar100(cfg: DataConfig) -> TensorData:
    return _cifar(cfg, ["train"], ["test"], b"fine_labels", 100)


def _read_folder(folder: str, classes: list[str], size: int):
    from PIL import Image

    xs, ys = [], []
    for label, cls in enumerate(classes):
        cdir = os.path.join(folder, cls)
        files = sorted(f for f in os.listdir(cdir) if f.lower().endswith(IMAGE_SUFFIXES)) if os.path.isdir(cdir) else []
        for name in files:
            with Image.open(os.path.join(cdir, name)) as im:
                xs.append(np.asarray(im.convert("RGB").resize((size, size)), dtype=np.uint8).transpose(2, 0, 1))
            ys.append(label)
    return np.stack(xs) if xs else np.zeros((0, 3, size, size), np.uint8), np.asarray(ys, dtype=np.int64)


@DATASETS.register("imagefolder")
def imagefolder(cfg: DataConfig) -> TensorData:
    """ROOT/train/<class>/*.png and ROOT/test (or ROOT/val)/<class>/*.png; classes from train."""
    train_dir = os.path.join(cfg.root, "train")
    require(bool(cfg.root) and os.path.isdir(train_dir), "data.root", cfg.root,
            "an existing directory with train/<class>/ and test/<class>/ (or val/) image folders")
    test_dir = next((os.path.join(cfg.root, d) for d in ("test", "val") if os.path.isdir(os.path.join(cfg.root, d))), None)
    require(test_dir is not None, "data.root", cfg.root, "needs a test/ or val/ folder beside train/")
    assert test_dir is not None
    classes = sorted(d for d in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, d)))
    x_tr, y_tr = _read_folder(train_dir, classes, cfg.image_size)
    x_te, y_te = _read_folder(test_dir, classes, cfg.image_size)
    require(len(y_tr) > 0 and len(y_te) > 0, "data.root", cfg.root, "found no images in train/ or test/")
    tr, te = _normalized(x_tr, x_te)
    return TensorData(tr, torch.as_tensor(y_tr), te, torch.as_tensor(y_te), len(classes))
