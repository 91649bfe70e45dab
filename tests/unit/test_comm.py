"""The communicator's rules that need no second process."""

from __future__ import annotations

import pathlib
import re

import torch

from lowband.comm import Communicator, placement
from lowband.comm.communicator import pick_backend

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "lowband"


def test_only_the_communicator_imports_torch_distributed():
    pattern = re.compile(r"^\s*(import torch\.distributed|from torch\.distributed|from torch import distributed"
                         r"|from torch\.nn\.parallel)", re.M)
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == ["comm/communicator.py"]


def test_backend_auto_is_the_placements_choice_for_the_ranks_on_this_machine(monkeypatch):
    assert pick_backend("auto", torch.device("cpu")) == "gloo"
    assert pick_backend("gloo", torch.device("cuda", 0)) == "gloo"
    monkeypatch.setattr(placement, "visible_gpus", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert pick_backend("auto", torch.device("cuda", 0)) == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four ranks share the one GPU: NCCL would refuse them
    assert pick_backend("auto", torch.device("cuda", 0)) == "gloo"


def test_one_process_moves_and_counts_nothing():
    comm = Communicator()
    t = torch.ones(10)
    assert torch.equal(comm.allreduce(t, "grad", mean=True), torch.ones(10))
    assert len(comm.all_gather(t, "params")) == 1
    comm.broadcast(t, 0, "init")
    assert all(s.sent == 0 and s.recv == 0 for s in comm.ledger.stats.values())
    assert comm.broadcast_bytes(b"abc", 0) == b"abc"


def test_snapshot_round_trips():
    comm = Communicator()
    comm.ledger.count("grad", 10, 20, 0.5)
    other = Communicator()
    other.ledger.load_snapshot(comm.ledger.snapshot())
    assert other.ledger.snapshot() == comm.ledger.snapshot() == {"grad": {"sent": 10, "recv": 20, "calls": 1, "seconds": 0.5,
                                                            "wire": 10, "inter": 0}}
    older = Communicator()  # a checkpoint written before busiest-link bytes were counted
    older.ledger.load_snapshot({"grad": {"sent": 10, "recv": 20, "calls": 1, "seconds": 0.5}})
    assert older.ledger.stats["grad"].wire == 0.0
