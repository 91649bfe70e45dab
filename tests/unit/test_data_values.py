"""Data that cannot train is refused when loaded: one line naming the array and the first bad index,
exit code 2, and no run directory."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lowband.cli import main


def npz(tmp_path, **change) -> str:
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.normal(size=(40, 1, 8)).astype(np.float32), "y_train": np.arange(40) % 2,
              "x_test": rng.normal(size=(10, 1, 8)).astype(np.float32), "y_test": np.arange(10) % 2}
    for key, edit in change.items():
        arrays[key] = edit(arrays[key].copy())
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def nan_at(i):
    def edit(x):
        x[i, 0, 3] = np.nan
        return x
    return edit


def label_at(i, value):
    def edit(y):
        y[i] = value
        return y
    return edit


@pytest.mark.parametrize("change, fragment", [
    ({"x_train": nan_at(3)}, "x_train[3] holds a non-finite value"),
    ({"x_test": nan_at(7)}, "x_test[7] holds a non-finite value"),
    ({"y_train": label_at(5, 7)}, "class 2 has no training sample (5 of 8 classes have none)"),  # C = 8 from the labels
    ({"y_test": label_at(2, -1)}, "y_test must hold integer class labels 0..C-1"),  # the .npz reader says so first
])
def test_bad_values_are_one_line_naming_the_array_and_index(tmp_path, capsys, change, fragment):
    out = tmp_path / "runs"
    code = main(["train", "--method", "single", "--dataset", npz(tmp_path, **change), "--model", "mlp",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and fragment in err and "lower optim.lr" not in err
    assert not out.exists() or os.listdir(out) == []


def test_a_class_without_a_training_sample_is_named(tmp_path, capsys):
    def three_classes_one_empty(y):
        return np.where(y == 1, 2, y)  # labels 0 and 2: class 1 has no sample
    path = npz(tmp_path, y_train=three_classes_one_empty, y_test=three_classes_one_empty)
    code = main(["train", "--method", "single", "--dataset", path, "--model", "mlp", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "class 1 has no training sample" in err
