"""The checkpoint store: atomic versions, integrity checks, byte counts, bad URLs."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from lowband.comm import Communicator
from lowband.comm.store import CheckpointStore, check_architecture
from lowband.errors import ConfigError, UsageError


def state(value: float) -> dict:
    return {"w": torch.full((4, 3), value), "b": torch.full((3,), value)}


def test_versions_newest_and_pruning(tmp_path):
    store = CheckpointStore(str(tmp_path))
    for step in (10, 20, 30, 40, 50):
        store.publish(1, step, state(step))
    assert store.versions(1) == [30, 40, 50]  # older ones pruned
    step, got = store.load_newest(1)
    assert step == 50 and torch.equal(got["w"], state(50)["w"])
    assert store.load_newest(1, newer_than=50) is None
    assert store.load_newest(7) is None
    assert not [f for f in os.listdir(tmp_path / "model1") if not f.endswith(".safetensors")]  # no temporaries


def test_file_url_works_like_a_directory(tmp_path):
    store = CheckpointStore(f"file://{tmp_path}/x")
    store.publish(0, 5, state(1.0))
    assert (tmp_path / "x" / "model0" / "step0000000005.safetensors").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous(tmp_path, damage, caplog):
    store = CheckpointStore(str(tmp_path))
    store.publish(0, 1, state(1.0))
    store.publish(0, 2, state(2.0))
    path = tmp_path / "model0" / "step0000000002.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        data[-1] ^= 0xFF  # same size, one tensor byte changed: only the checksum can tell
        path.write_bytes(bytes(data))
    step, got = store.load_newest(0)
    assert step == 1 and torch.equal(got["w"], state(1.0)["w"])
    assert "skipping damaged checkpoint" in caplog.text


def test_bytes_written_and_read_are_the_file_sizes(tmp_path):
    comm = Communicator()
    store = CheckpointStore(str(tmp_path), comm)
    store.publish(3, 100, state(1.0))
    size = (tmp_path / "model3" / "step0000000100.safetensors").stat().st_size
    store.load_newest(3)
    store.load_newest(3)
    assert comm.stats["ckpt"].sent == size and comm.stats["ckpt"].recv == 2 * size


def test_unwritable_or_unknown_stores_are_config_errors(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
    for url in ("/proc/no/such/dir", "nosuchproto://bucket/x"):
        with pytest.raises(ConfigError) as e:
            CheckpointStore(url)
        assert e.value.field == "method.store"
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(ConfigError):
            CheckpointStore(str(ro))


def test_a_checkpoint_of_another_architecture_is_a_usage_error():
    with pytest.raises(UsageError, match="another architecture"):
        check_architecture(state(1.0), {"w": torch.zeros(5, 3), "b": torch.zeros(3)}, "store/model1 step 3")
    check_architecture(state(1.0), state(2.0), "same")
