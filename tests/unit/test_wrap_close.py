"""lowband.wrap's Sync.close: a process group wrap joined itself (from torchrun's environment) is left once
every worker has come to close (a worker that exits while a peer still evaluates tore gloo down under it:
SIGABRT, seen once in the suite's own-loop example); a communicator the caller gave stays the caller's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lowband
from lowband.comm import Communicator

pytestmark = pytest.mark.unit


class Watched(Communicator):
    closed: list[bool]

    def close(self, clean: bool = False) -> None:
        self.closed.append(clean)


def wrapped(monkeypatch, given: bool):
    comm = Watched(0, 1, torch.device("cpu"))
    comm.closed = []
    monkeypatch.setattr(Communicator, "from_env", classmethod(lambda cls, device: comm))
    model = nn.Linear(4, 1)
    sync = lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "allreduce",
                        comm=comm if given else None)
    return sync, comm


def test_a_group_wrap_joined_is_left_cleanly_at_close(monkeypatch):
    sync, comm = wrapped(monkeypatch, given=False)
    sync.close()
    assert comm.closed == [True]  # clean: every rank waits for the others before the group goes


def test_a_communicator_the_caller_gave_stays_open(monkeypatch):
    sync, comm = wrapped(monkeypatch, given=True)
    sync.close()
    assert comm.closed == []


def test_a_refused_method_leaves_the_group_it_joined(monkeypatch):
    comm = Watched(0, 1, torch.device("cpu"))
    comm.closed = []
    monkeypatch.setattr(Communicator, "from_env", classmethod(lambda cls, device: comm))
    model = nn.Linear(4, 1)
    with pytest.raises(lowband.ConfigError):
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "dpsgd")  # needs 2 workers or more
    assert comm.closed == [False]
