"""Who takes part in an outer step: the quorum a method's sync consults, for a fixed world and an elastic one.

A method with an outer loop (local SGD, DiLoCo, Streaming DiLoCo) never asks who its peers are. At each
outer step it hands its quorum the exchange to run, `quorum.outer_step(exchange, state)`, as torchft's
DiLoCo asks its Manager (start_quorum, allreduce over the participants, should_commit):

  exchange(round)   the method's collectives over `round.comm`: every member sends its pseudo-gradient
                    (zeros unless `round.contributes`), the mean is taken over `round.contributors`, and
                    θ_global steps where `round.holds_global`; its merges and buffer averages too
  state             the method's `OuterState`: what every holder of one θ_global version shares (sent to a
                    member that holds another, a receiver), and a snapshot to undo an exchange that did
                    not commit

`FixedQuorum` is a world that never changes: the round is every rank of one communicator, each contributes
and holds θ_global, and every round commits; it adds nothing to the method's own collectives. An elastic
job's quorum (comm/elastic_quorum.py) meets its live workers at every outer step, runs the exchange over a
group of them, hands receivers the source's state, and votes; a round that does not commit is undone and
met again without whoever failed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from lowband.comm.communicator import Communicator


@dataclass
class Round:
    """One outer step's members, as the method's exchange sees them."""

    comm: Communicator  # the members, ranks in the round's order (rank 0: the source)
    contributors: int  # how many members send a pseudo-gradient: the mean's divisor
    contributes: bool = True  # this member sends its own (False: zeros; it trained nothing from this θ_global)
    holds_global: bool = True  # this member's θ_global is the round's (False: it receives the source's after)

    @property
    def writes(self) -> bool:
        """Whether this member writes the round's own figures (the source, rank 0)."""
        return self.comm.rank == 0


@runtime_checkable
class OuterState(Protocol):
    """What a quorum needs of a method's outer state (torchft's state_dict / load_state_dict callbacks)."""

    def shared_state(self) -> dict:
        """What every holder of one θ_global version holds alike (θ_global, the outer optimizer's state,
        the outer clock): fingerprinted, and sent to a member that holds another."""

    def receive(self, shared: dict, extra: dict) -> None:
        """Take a source's `shared_state` and `extra` (its `handover`): this worker's own residuals are
        dropped and its local model starts from θ_global."""

    def handover(self) -> dict:
        """What a receiver needs besides the shared state (the source's local floating buffers)."""

    def snapshot(self) -> Any:
        """Everything an exchange changes (shared state, residuals, the local model), to undo it."""

    def restore(self, saved: Any) -> None:
        """Undo an exchange: the state `snapshot` returned."""

    def steps_to_sync(self) -> int:
        """Inner steps from the outer clock to the next outer step: the next slice's length in an elastic job."""

    def next_sync(self, step: int) -> int:
        """The first step after `step` at which the method takes an outer step (a pure function of the step)."""


Exchange = Callable[[Round], None]


class Quorum(Protocol):
    """Who meets at an outer step (see the module docstring)."""

    def outer_step(self, exchange: Exchange, state: OuterState) -> None:
        """Meet, run `exchange` over the round's members, hand receivers the source's state, and commit;
        again until a round commits."""


class FixedQuorum:
    """A world that never changes: every rank of `comm` in every round, each contributing; always commits."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    def outer_step(self, exchange: Exchange, state: OuterState) -> None:
        exchange(Round(self.comm, self.comm.world))


# ---- a state on the wire: plain-typed structure + safetensors, never pickle ---------------------------

def pack_state(state: Any) -> bytes:
    """`state` (dicts with str or int keys, lists, tensors, numbers, strings, None) as bytes: safetensors
    of its tensors, the structure as JSON in the metadata. No pickle (rule 9)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _tree(state, tensors)
    return save_tensors({k: t.detach().cpu().contiguous() for k, t in tensors.items()},
                        metadata={"tree": json.dumps(tree)})


def unpack_state(data: bytes) -> Any:
    """The state `pack_state` wrote."""
    tensors = load_tensors(data)
    meta = _metadata(data)
    return _untree(json.loads(meta["tree"]), tensors)


def _tree(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = value
        return {"t": name}
    if isinstance(value, dict):
        return {"d": [[k, _tree(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"l": [_tree(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"cannot put a {type(value).__name__} on the wire")


def _untree(node: dict, tensors: dict[str, torch.Tensor]) -> Any:
    if "t" in node:
        return tensors[node["t"]]
    if "d" in node:
        return {k: _untree(v, tensors) for k, v in node["d"]}
    if "l" in node:
        return [_untree(v, tensors) for v in node["l"]]
    return node["v"]


def _metadata(data: bytes) -> dict:
    """A safetensors file's metadata: the header's JSON after its 8-byte length."""
    stream = io.BytesIO(data)
    size = int.from_bytes(stream.read(8), "little")
    return json.loads(stream.read(size)).get("__metadata__", {})
