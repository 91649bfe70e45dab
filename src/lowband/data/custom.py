"""Your own data: `data.name = "package.module:factory"` or `data.name = "path/to/data.npz"`.

The factory is called with no arguments and returns the four arrays (torch tensors or numpy
arrays) as a tuple `(x_train, y_train, x_test, y_test)` or a dict with those keys:
x float, shaped (N, *in_shape), e.g. (N, 1, 40) or (N, 3, 32, 32); y integer class labels
0..C-1, shaped (N,). It may instead return two map-style torch Datasets `(train, test)` (or a
dict with keys train and test) whose items are `(x, y)` pairs; they are read once, into memory.
An .npz file holds the four arrays under those names
(`numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)`). The number of classes
is the largest label plus one. Anything else stops the command with one line naming data.name.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

from lowband.errors import ConfigError
from lowband.registry.plugins import import_factory

KEYS = ("x_train", "y_train", "x_test", "y_test")


def is_custom(name: str) -> bool:
    return name.endswith(".npz") or name.startswith("npz:") or ":" in name


def load_custom(name: str) -> tuple:
    """The data set a factory spec or an .npz path names, as (x_train, y_train, x_test, y_test, classes)."""
    if name.endswith(".npz") or name.startswith("npz:"):
        return from_npz(name)
    return from_factory(name)


def from_npz(name: str) -> tuple:
    path = name.removeprefix("npz:")
    if not os.path.isfile(path):
        raise ConfigError("data.name", name, "no such .npz file")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in KEYS if k not in f.files]
            if missing:
                raise ConfigError("data.name", name, f"the .npz lacks {', '.join(missing)} (needs {', '.join(KEYS)}; "
                                                     f"it has {', '.join(f.files) or 'nothing'})")
            arrays = [f[k] for k in KEYS]
    except (OSError, ValueError) as e:
        raise ConfigError("data.name", name, f"not a readable .npz file ({e})") from None
    return tensors(name, arrays)


def from_factory(spec: str) -> tuple:
    factory = import_factory(spec, "data.name")
    try:
        out = factory()
    except Exception as e:  # the user's code: any failure is reported on one line
        raise ConfigError("data.name", spec, f"the factory raised {type(e).__name__}: {e}") from None
    if isinstance(out, dict) and all(k in out for k in KEYS):
        arrays = [out[k] for k in KEYS]
    elif isinstance(out, (tuple, list)) and len(out) == 4:
        arrays = list(out)
    elif isinstance(out, dict) and set(out) == {"train", "test"} and all(map(is_dataset, out.values())):
        arrays = from_datasets(spec, out["train"], out["test"])
    elif isinstance(out, (tuple, list)) and len(out) == 2 and all(map(is_dataset, out)):
        arrays = from_datasets(spec, *out)
    else:
        raise ConfigError("data.name", spec, f"the factory returned {type(out).__name__}; expected "
                                             "(x_train, y_train, x_test, y_test), a dict with those keys, "
                                             "or two torch Datasets (train, test)")
    return tensors(spec, arrays)


def is_dataset(obj) -> bool:
    """A map-style data set (len and indexing), not an array of numbers."""
    return hasattr(obj, "__len__") and hasattr(obj, "__getitem__") and not isinstance(obj, (torch.Tensor, np.ndarray))


def from_datasets(spec: str, train, test) -> list:
    """[x_train, y_train, x_test, y_test] read from two Datasets of (x, y) items."""
    arrays = []
    for part, ds in (("train", train), ("test", test)):
        try:
            items = [ds[i] for i in range(len(ds))]
            arrays.append(torch.stack([torch.as_tensor(np.asarray(x)) for x, _ in items]))
            arrays.append(torch.as_tensor([int(y) for _, y in items]))
        except Exception as e:  # noqa: BLE001 - the user's data set: any failure is one line
            raise ConfigError("data.name", spec, f"the {part} Dataset's items are not (x, y) pairs of an array and "
                                                 f"a class label ({type(e).__name__}: {e})") from None
    return arrays


def tensors(name: str, arrays: list) -> tuple:
    """(x_train, y_train, x_test, y_test, num_classes) after checking shapes and types. A classifier's data:
    x float32 (N, *in_shape), y int64 labels (N,). A language model's (every position has a target): x and y
    int64 tokens of one shape (N, context), `num_classes` the vocabulary (the largest token + 1)."""
    try:
        x_tr, y_tr, x_te, y_te = (torch.as_tensor(np.asarray(a)) for a in arrays)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError("data.name", name, f"the arrays are not numeric ({e})") from None
    if is_token_data(x_tr, y_tr):
        return token_tensors(name, x_tr, y_tr, x_te, y_te)
    for key, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.dim() < 2 or y.dim() != 1 or len(x) != len(y) or len(y) == 0:
            raise ConfigError("data.name", name, f"x_{key} {tuple(x.shape)} and y_{key} {tuple(y.shape)} do not fit: "
                                                 "expected x (N, *in_shape) and y (N,) with N > 0, or token windows "
                                                 "x and y of one shape (N, context)")
        if y.is_floating_point() or y.dtype == torch.bool or int(y.min()) < 0:
            raise ConfigError("data.name", name, f"y_{key} must hold integer class labels 0..C-1")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ConfigError("data.name", name, f"x_train samples {tuple(x_tr.shape[1:])} and x_test samples "
                                             f"{tuple(x_te.shape[1:])} differ in shape")
    classes = int(max(y_tr.max(), y_te.max())) + 1
    return x_tr.float().contiguous(), y_tr.long(), x_te.float().contiguous(), y_te.long(), classes


def is_token_data(x: torch.Tensor, y: torch.Tensor) -> bool:
    """A language model's data: integer token windows x and their next tokens y, both (N, context)."""
    return x.dim() == 2 and y.dim() == 2 and not x.is_floating_point() and not y.is_floating_point()


def token_tensors(name: str, x_tr, y_tr, x_te, y_te) -> tuple:
    for key, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.shape != y.shape or len(x) == 0 or x.dim() != 2 or y.dim() != 2:
            raise ConfigError("data.name", name, f"x_{key} {tuple(x.shape)} and y_{key} {tuple(y.shape)} do not fit: "
                                                 "token windows need x and y of one shape (N, context), N > 0")
        if x.dtype == torch.bool or int(min(x.min(), y.min())) < 0:
            raise ConfigError("data.name", name, f"x_{key} and y_{key} must hold tokens 0..V-1")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ConfigError("data.name", name, f"x_train windows {tuple(x_tr.shape[1:])} and x_test windows "
                                             f"{tuple(x_te.shape[1:])} differ in length")
    vocab = int(max(x_tr.max(), y_tr.max(), x_te.max(), y_te.max())) + 1
    return x_tr.long().contiguous(), y_tr.long(), x_te.long().contiguous(), y_te.long(), vocab


@functools.lru_cache(maxsize=8)
def custom_task(name: str) -> str:
    """'lm' when a user's data set (factory or .npz) holds token windows, else 'classify' (loaded once per
    process: the task decides the model, the metric and which methods can train it)."""
    return "lm" if load_custom(name)[1].dim() == 2 else "classify"
