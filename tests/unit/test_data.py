"""Data sets from their on-disk formats, and the batch stream."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from lowband.config import DataConfig
from lowband.data import Batches, TensorData, load_dataset, partition
from lowband.data.base import hold_out, read_dataset
from lowband.data.loader import crop_flip
from lowband.errors import ConfigError


def write_cifar10(root, n=20):
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, n).tolist(), b"batch_label": b"x"}
        with open(root / name, "wb") as f:
            pickle.dump(batch, f)


def test_cifar10_reads_the_python_pickle_format(tmp_path):
    write_cifar10(tmp_path)
    d = read_dataset(DataConfig(name="cifar10", root=str(tmp_path)))
    assert d.x_train.shape == (100, 3, 32, 32) and d.x_test.shape == (20, 3, 32, 32)
    assert d.num_classes == 10 and d.y_train.dtype == torch.int64
    assert d.x_train.mean(dim=(0, 2, 3)).abs().max() < 1e-4  # normalised per channel on the train set


def test_cifar100_uses_fine_labels(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("train", 30), ("test", 10)):
        with open(tmp_path / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         b"fine_labels": [99] * n, b"coarse_labels": [1] * n}, f)
    d = read_dataset(DataConfig(name="cifar100", root=str(tmp_path)))  # the reader alone: 99 classes have no sample
    assert d.num_classes == 100 and set(d.y_train.tolist()) == {99}
    with pytest.raises(ConfigError, match="class 0 has no training sample"):  # which training refuses
        load_dataset(DataConfig(name="cifar100", root=str(tmp_path)))


def test_a_data_file_that_would_run_code_is_refused(tmp_path):
    write_cifar10(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path)))


def test_missing_data_directory_names_the_field(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path / "nope")))
    assert e.value.field == "data.root"
    with pytest.raises(ConfigError, match="data_batch_1"):
        load_dataset(DataConfig(name="cifar10", root=str(tmp_path)))


def test_imagefolder_reads_class_folders(tmp_path):
    from PIL import Image

    for split, n in (("train", 3), ("val", 1)):
        for cls, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (20, 14), color).save(tmp_path / split / cls / f"{i}.png")
    d = read_dataset(DataConfig(name="imagefolder", root=str(tmp_path), image_size=16))
    assert d.x_train.shape == (6, 3, 16, 16) and d.x_test.shape == (2, 3, 16, 16)
    assert d.y_train.tolist() == [0, 0, 0, 1, 1, 1] and d.num_classes == 2
    assert d.x_train[0, 0].mean() > d.x_train[3, 0].mean()  # the cat is red


@pytest.mark.parametrize("name, shape, n_test", [("digits", (1, 8, 8), 360),
                                                      pytest.param("mnist5k", (1, 28, 28), 1000, marks=pytest.mark.slow)])
def test_packaged_datasets_have_fixed_stratified_splits(name, shape, n_test):
    a, b = load_dataset(DataConfig(name=name)), load_dataset(DataConfig(name=name))
    assert a.in_shape == shape and len(a.y_test) == n_test
    assert torch.equal(a.y_test, b.y_test)
    counts = torch.bincount(a.y_test, minlength=10).float()
    assert counts.max() - counts.min() <= 0.05 * len(a.y_test)  # stratified


def tiny(n=40) -> TensorData:
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1, 1)
    return TensorData(x, torch.arange(n) % 3, x[:4], torch.arange(4), 3)


def test_batches_cover_the_shard_once_per_epoch_and_reshuffle():
    data, shard = tiny(), torch.arange(10, 30)
    stream = Batches(data, shard, batch_size=5, steps=4, seed=7)
    e1 = torch.cat([b.ids for b in stream.epoch(1)])
    e2 = torch.cat([b.ids for b in stream.epoch(2)])
    assert torch.equal(e1.sort().values, shard) and torch.equal(e2.sort().values, shard)
    assert not torch.equal(e1, e2)
    assert torch.equal(e1, torch.cat([b.ids for b in stream.epoch(1)]))  # reproducible
    b = next(stream.epoch(1))
    x, y, ids = b.x, b.y, b.ids
    assert torch.equal(x.flatten(), ids.float()) and torch.equal(y, ids % 3)


def test_crop_flip_keeps_shape_and_moves_pixels():
    x = torch.randn(8, 3, 32, 32)
    out = crop_flip(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and not torch.equal(out, x)


def test_validation_split_is_stratified_disjoint_and_fixed_by_its_seed():
    y = torch.arange(200) % 4
    data = TensorData(torch.arange(200.0)[:, None], y, torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64), 4)
    a = hold_out(data, 0.1, seed=3)
    b = hold_out(data, 0.1, seed=3)
    c = hold_out(data, 0.1, seed=4)
    val, train = a.x_val[:, 0].long(), a.x_train[:, 0].long()
    assert len(val) == 20 and len(train) == 180  # 10% of each class of 50 is 5, four classes
    assert torch.bincount(a.y_val, minlength=4).tolist() == [5, 5, 5, 5]
    assert set(val.tolist()).isdisjoint(train.tolist()) and len(set(val.tolist()) | set(train.tolist())) == 200
    assert torch.equal(y[val], a.y_val) and torch.equal(y[train], a.y_train)  # samples keep their labels
    assert torch.equal(a.x_val, b.x_val) and not torch.equal(a.x_val, c.x_val)


def test_partitions_never_reach_the_validation_samples(tmp_path):
    cfg = DataConfig(name="digits", val_fraction=0.2, cache_dir=str(tmp_path))
    d = load_dataset(cfg)
    assert len(d.y_val) == round(0.2 * (len(d.y_train) + len(d.y_val)))
    shards = partition(d.y_train, 3, "iid", seed=0)
    assert sum(len(s) for s in shards) == len(d.y_train)  # shards index the training part only
    train_rows = {tuple(r) for r in d.x_train.flatten(1).tolist()}
    assert not any(tuple(r) in train_rows for r in d.x_val.flatten(1).tolist()[:50])
