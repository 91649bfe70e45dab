"""Your own data: a factory or an .npz, the same tensors either way; bad ones are one ConfigError line."""

import os

import numpy as np
import pytest
import torch

from lowband import cli
from lowband.config import DataConfig
from lowband.data import load_dataset
from lowband.data.base import read_dataset
from lowband.errors import ConfigError
from tests import mydata


def test_a_factory_and_an_npz_give_the_factory_tensors(tmp_path):
    x_tr, y_tr, x_te, y_te = mydata.blobs()
    path = tmp_path / "d.npz"
    np.savez(path, **mydata.as_dict())
    for name in ("tests.mydata:blobs", "tests.mydata:as_dict", str(path), f"npz:{path}", "tests.mydata:datasets",
                 "tests.mydata:datasets_dict"):
        d = read_dataset(DataConfig(name=name))
        assert torch.equal(d.x_train, x_tr) and torch.equal(d.y_test, y_te) and d.num_classes == 2, name
        assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    held = load_dataset(DataConfig(name="tests.mydata:blobs", val_fraction=0.2))
    assert len(held.y_train) + len(held.y_val) == len(y_tr) and held.in_shape == (1, 8)


@pytest.mark.parametrize("name, fragment", [
    ("tests.mydata:raises", "the factory raised RuntimeError: disk on fire"),
    ("tests.mydata:NOT_CALLABLE", "not a callable factory"),
    ("tests.mydata:three_things", "expected (x_train, y_train, x_test, y_test)"),
    ("tests.mydata:float_labels", "must hold integer class labels"),
    ("tests.mydata:nope", "could not import the factory"),
    ("tests.mydata:bad_items", "the test Dataset's items are not (x, y) pairs"),
    ("missing.npz", "no such .npz file"),
])
def test_bad_factories_name_data_name_and_the_problem(name, fragment):
    with pytest.raises(ConfigError, match="data.name") as e:
        read_dataset(DataConfig(name=name))
    assert fragment in str(e.value)


def test_an_npz_without_the_arrays(tmp_path):
    path = tmp_path / "half.npz"
    np.savez(path, x_train=np.zeros((4, 2)), y_train=np.zeros(4, dtype=int))
    with pytest.raises(ConfigError, match="lacks x_test, y_test"):
        read_dataset(DataConfig(name=str(path)))


@pytest.mark.parametrize("name", ["tests.mydata:raises", "tests.mydata:NOT_CALLABLE", "tests.mydata:three_things"])
def test_the_command_stops_with_one_line_exit_2_and_no_run_dir(name, tmp_path, capsys):
    code = cli.main(["train", "--method", "single", "--epochs", "1", "--dataset", name, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("lowband: error: data.name=") and "\n" not in err
    assert os.listdir(tmp_path) == []


def test_a_factorys_token_windows_are_a_language_models_data_model_and_metric_alike(tmp_path):
    """One rule for what the data is: targets at every position make it a language model's, so the model
    predicts every position and the run is judged by bits per byte, not accuracy."""
    from lowband.data.metric import BITS_PER_BYTE, metric_for, task_of
    from lowband.run.metrics import read_metrics

    name = "tests.mydata:token_windows"
    d = load_dataset(DataConfig(name=name, val_fraction=0.2))
    assert (d.task, d.num_classes, d.x_train.dtype, tuple(d.x_train.shape[1:])) == ("lm", 5, torch.int64, (8,))
    assert len(d.y_train) + len(d.y_val) == 180 and d.y_val.shape[1] == 8  # 3/4 of 240 windows, a fifth held out
    assert task_of(name) == "lm" and metric_for(name) is BITS_PER_BYTE and task_of("tests.mydata:blobs") == "classify"
    code = cli.main(["train", "--method", "single", "--dataset", name, "--model", "gpt", "--epochs", "1", "-q",
                     "--run-dir", str(tmp_path / "run")])
    record = read_metrics(str(tmp_path / "run"))[-1]
    assert code == 0 and record.val_bpb is not None and record.val_bpb == pytest.approx(record.val_loss / np.log(2))
