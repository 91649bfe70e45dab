"""Sparsifiers for gossip: what a node sends its neighbours at a mixing step, and how it applies theirs.

A gossip step mixes x_i <- sum_j W_ij x_j over node i and its neighbours (methods/gossip.py). The
sparsifier decides which coordinates take part and what goes on the wire:

  Dense    every coordinate, values only (D-PSGD)
  RandomK  a random subset, each coordinate kept with probability p, the same on every node in a
           step because it comes from a seed all nodes share and the step number (RD-PSGD). Its
           index codec (comm/index_codecs.py) says whether the indices travel: `seed` sends none, `gaps`
           and `bitmask` send them and the receiver checks they equal its own. p = 1 is Dense.
  TopK     the k largest changes against public copies x_hat that all parties update alike, with
           error feedback: what is left out stays in x - x_hat and goes later (CHOCO-SGD,
           Koloskova et al. 2019). Indices differ per node, so they always travel.

Every sparsifier sends its values through a value codec (`method.codec`, comm/value_codecs.py: fp32
by default, or fp16, bf16, int8, int4, int2). A lossy codec's payload is what travels; every node
decodes what it receives, and TopK moves its own public copy by the *decoded* values, so that all
copies of it stay equal. fp16 and bf16 suit every sparsifier; int codecs quantize what they are
given, so on Dense and RandomK they quantize the model itself each step (a noise floor), while
TopK's messages are changes, the setting CHOCO-SGD's analysis covers.

A `Message` is one step's send: values (tag "params"), encoded indices (tag "index"), and whether
the values' length differs per node. Parts whose length the receiver cannot know travel after a
header of their lengths (`Communicator.exchange_sized_async`); `Message.bytes_by_tag` is exactly
what one neighbour's link carries per tag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lowband.comm.index_codecs import INDEX_CODECS
from lowband.comm.masks import random_indices
from lowband.comm.value_codecs import Codec

LENGTH_BYTES = 8  # one int64 per part in the lengths header


class Timers(dict):
    """Seconds per phase of the exchange: index, select, extract, comm, expand."""

    def add(self, phase: str, t0: float) -> None:
        self[phase] = self.get(phase, 0.0) + time.perf_counter() - t0


@dataclass
class Mixing:
    """This node's row of the mixing matrix: its neighbours and the weights of itself and of each."""

    rank: int
    peers: list[int]
    w_self: float
    w_peer: dict[int, float]


@dataclass
class Message:
    """One step's send to every neighbour; `idx` (the coordinates mixed here, None: all) stays home."""

    values: torch.Tensor
    index: torch.Tensor | None = None  # encoded indices (uint8); None: the receiver knows them
    sized: bool = False  # True: the values' length differs per node, so it travels in the header
    idx: torch.Tensor | None = None

    def sized_parts(self) -> list[tuple[str, torch.Tensor]]:
        """The (tag, tensor) parts whose lengths go first, in wire order."""
        parts = [] if self.index is None else [("index", self.index)]
        return parts + ([("params", self.values)] if self.sized else [])

    def bytes_by_tag(self) -> dict[str, int]:
        """Bytes this message puts on one neighbour's link, per tag (the lengths header counts as index)."""
        out = {"params": self.values.numel() * self.values.element_size()}
        sized = self.sized_parts()
        if sized:
            out["index"] = (0 if self.index is None else self.index.numel()) + LENGTH_BYTES * len(sized)
        return out


@dataclass
class Incoming:
    """What one neighbour sent: its values and, when they travel, its encoded indices."""

    values: torch.Tensor
    index: torch.Tensor | None = None


class Sparsifier:
    """Chooses a step's message and applies the neighbours' messages to the flat parameters `x`."""

    x: torch.Tensor
    mixing: Mixing
    timers: Timers
    value_codec: Codec

    def bind(self, x: torch.Tensor, mixing: Mixing, timers: Timers, value_codec: Codec | None = None) -> None:
        """Attach to a node's flat parameters, mixing row, phase timers and value codec (once, at setup)."""
        self.x, self.mixing, self.timers = x, mixing, timers
        self.value_codec = value_codec or Codec()

    def pack(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what travels, what every receiver will read) for `values`."""
        if self.value_codec.lossless:
            return values, values
        payload = self.value_codec.encode(values)
        read = self.value_codec.decode(payload, values.numel()).to(values.device)
        return payload.to(values.device), read

    def unpack(self, got: Incoming, count: int) -> torch.Tensor:
        """The values a neighbour sent, decoded (`count` of them)."""
        if self.value_codec.lossless:
            return got.values
        return self.value_codec.decode(got.values.cpu(), count).to(self.x.device)

    def decoded(self, incoming: dict[int, Incoming], count: int) -> dict[int, Incoming]:
        return {j: Incoming(self.unpack(got, count), got.index) for j, got in incoming.items()}

    def message(self, step: int) -> Message:
        raise NotImplementedError

    def apply(self, msg: Message, incoming: dict[int, Incoming]) -> None:
        """Mix the neighbours' messages into x (after the exchange of `msg` has completed)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def mix(x: torch.Tensor, idx: torch.Tensor | None, mixing: Mixing, incoming: dict[int, Incoming]) -> None:
    """x[idx] <- w_self x[idx] + sum_j w_j v_j (idx None: every coordinate); the rest keep their value."""
    with torch.no_grad():
        mixed = mixing.w_self * (x if idx is None else x[idx])
        for j, got in incoming.items():
            mixed.add_(got.values, alpha=mixing.w_peer[j])
        if idx is None:
            x.copy_(mixed)
        else:
            x[idx] = mixed


class Dense(Sparsifier):
    """Every coordinate, as values only: D-PSGD."""

    def message(self, step: int) -> Message:
        t0 = time.perf_counter()
        values, _ = self.pack(self.x.clone())
        self.timers.add("extract", t0)
        return Message(values)

    def apply(self, msg: Message, incoming: dict[int, Incoming]) -> None:
        mix(self.x, None, self.mixing, self.decoded(incoming, self.x.numel()))


def mask_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s mask, the same on every node."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1)


class RandomK(Sparsifier):
    """Coordinates kept with probability p from a seed shared by all nodes: RD-PSGD."""

    def __init__(self, p: float, index: str, sampler: str, seed: int):
        self.p, self.sampler, self.seed = p, sampler, seed
        self.index_codec = INDEX_CODECS[index]()

    def indices(self, step: int) -> torch.Tensor | None:
        """Step `step`'s coordinates on every node; None: all of them (p = 1)."""
        if self.p == 1.0:
            return None
        gen = torch.Generator().manual_seed(mask_seed(self.seed, step))
        return random_indices(self.x.numel(), self.p, gen, self.sampler).to(self.x.device)

    def message(self, step: int) -> Message:
        t0 = time.perf_counter()
        idx = self.indices(step)
        index = self.index_codec.encode(idx.cpu(), self.x.numel()) if idx is not None and self.index_codec.sends_indices else None
        self.timers.add("index", t0)
        t0 = time.perf_counter()
        values, _ = self.pack(self.x.clone() if idx is None else self.x[idx])
        self.timers.add("extract", t0)
        return Message(values, index, idx=idx)

    def apply(self, msg: Message, incoming: dict[int, Incoming]) -> None:
        if msg.idx is not None:
            self._check(msg.idx, incoming)
        count = self.x.numel() if msg.idx is None else msg.idx.numel()
        mix(self.x, msg.idx, self.mixing, self.decoded(incoming, count))

    def _check(self, idx: torch.Tensor, incoming: dict[int, Incoming]) -> None:
        """Neighbours that sent indices must have mixed the same coordinates as this node."""
        for j, got in incoming.items():
            if got.index is None:
                continue
            if not torch.equal(self.index_codec.decode(got.index, self.x.numel()).to(idx.device), idx):
                raise RuntimeError(f"indices from rank {j} differ from this rank's: the shared mask seed diverged")


@dataclass
class TopK(Sparsifier):
    """The k = max(1, round(p d)) largest changes against the public copies, with error feedback
    and consensus step size gamma: CHOCO-SGD. With p = 1 and gamma = 1 this is Dense exactly."""

    p: float
    index: str
    gamma: float
    copies: dict[int, torch.Tensor] = field(default_factory=dict)

    def bind(self, x: torch.Tensor, mixing: Mixing, timers: Timers, value_codec: Codec | None = None) -> None:
        super().bind(x, mixing, timers, value_codec)  # equal initial models: everyone's public copies start at x
        self.index_codec = INDEX_CODECS[self.index]()
        self.copies = {j: x.detach().clone() for j in [mixing.rank, *mixing.peers]}

    def message(self, step: int) -> Message:
        me, d = self.copies[self.mixing.rank], self.x.numel()
        t0 = time.perf_counter()
        delta = self.x.detach() - me
        idx = torch.topk(delta.abs(), max(1, round(self.p * d)), sorted=False).indices.sort().values
        self.timers.add("select", t0)
        t0 = time.perf_counter()
        (values, read), index = self.pack(delta[idx]), self.index_codec.encode(idx.cpu(), d)
        self.timers.add("extract", t0)
        me[idx] += read  # our own public copy moves as the neighbours' copies of it will
        return Message(values, index, sized=True, idx=idx)

    def apply(self, msg: Message, incoming: dict[int, Incoming]) -> None:
        with torch.no_grad():
            me, pull = self.copies[self.mixing.rank], torch.zeros_like(self.x)
            for j, got in incoming.items():
                assert got.index is not None  # TopK indices always travel
                idx = self.index_codec.decode(got.index, self.x.numel()).to(self.x.device)
                self.copies[j][idx] += self.unpack(got, idx.numel())
                pull.add_(self.copies[j] - me, alpha=self.mixing.w_peer[j])
            self.x.add_(pull, alpha=self.gamma)

    def state_dict(self) -> dict:
        return {f"copy{j}": t for j, t in self.copies.items()}

    def load_state_dict(self, state: dict) -> None:
        for j, t in self.copies.items():
            t.copy_(state[f"copy{j}"])
