"""Gossip: decentralized SGD where each node mixes with its neighbours only (D-PSGD, RD-PSGD, TopK).

D-PSGD is Lian et al. 2017, "Can Decentralized Algorithms Outperform Centralized Algorithms?";
RD-PSGD is the randomized variant of papers/rd-psgd-randomized-decentralized.txt. At step t
node i computes its gradient g_i at x_i, mixes x_i <- sum_j W_ij x_j over itself and its
neighbours (W symmetric, doubly stochastic; comm/topology.py) and then takes the optimizer step
with g_i. RD-PSGD mixes only a random subset of coordinates, each kept with probability p and
the same on every node in a step; the rest keep their local value. The subset comes from a
seed shared by all nodes and the step number, so in `seed` mode no index crosses the wire;
`gaps` and `bitmask` send the indices as the paper does (comm/index_codecs.py). With p = 1 RD-PSGD is
D-PSGD exactly. `sync_every = s` mixes only every s-th step. The exchange for a step is posted
right after the previous optimizer step and waited for after backward, so it overlaps with the
forward and backward pass. Bytes: "params" (values) and "index" (indices and length headers).

There is one method, `Gossip`; what a step sends is its sparsifier's business
(methods/sparsifiers.py), which the config picks: `dpsgd` mixes every coordinate (Dense),
`rdpsgd` a shared random subset (RandomK), `topk` the largest changes with error feedback (TopK,
methods/topk.py). The registered names differ only in their config.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import torch

from lowband.comm.averaging import averaged_copy
from lowband.comm.communicator import Pending
from lowband.comm.topology import mixing_matrix, neighbours
from lowband.comm.value_codecs import DENSE, VALUE_SPECS, parse_codec
from lowband.config import Form, MethodConfig, opt
from lowband.methods.base import Method
from lowband.methods.sparsifiers import (
    Dense,
    Incoming,
    Message,
    Mixing,
    RandomK,
    Sparsifier,
    Timers,
    mask_seed,
)
from lowband.models.flat import bind_flat_parameters
from lowband.registry import METHODS

__all__ = ["DPSGD", "RDPSGD", "DPSGDConfig", "Gossip", "RDPSGDConfig", "mask_seed"]


@dataclass(kw_only=True)
class DPSGDConfig(MethodConfig):
    name: str = opt("dpsgd", "training method")
    topology: Literal["ring", "torus", "complete"] = opt("ring", "who mixes with whom")
    sync_every: int = opt(1, "mix every this many steps (the synchronisation delay s)", bounds=">= 1")
    codec: str = opt("fp32", "how the mixed values travel (int codecs: best with topk)",
                     form=Form(f"a dense codec: {VALUE_SPECS}", DENSE, note=" (the sparsifier chooses the coordinates)"))

    def sparsifier(self, seed: int) -> Sparsifier:
        """What a mixing step sends: every coordinate."""
        return Dense()


@dataclass(kw_only=True)
class RDPSGDConfig(DPSGDConfig):
    name: str = opt("rdpsgd", "training method")
    p: float = opt(0.1, "fraction of coordinates mixed per step (the sparsity ratio)", bounds="(0, 1]")
    index: Literal["seed", "gaps", "bitmask"] = opt("seed", "how the receiver learns the indices")
    sampler: Literal["geometric", "bernoulli"] = opt("geometric", "index generation: O(p d) skips or O(d) draws")

    def sparsifier(self, seed: int) -> Sparsifier:
        """What a mixing step sends: a random subset shared by all nodes through `seed`."""
        return RandomK(self.p, self.index, self.sampler, seed)


@dataclass
class Exchange:
    """One step's exchange in flight: the message sent, what arrives from each peer, the work pending."""

    msg: Message
    incoming: dict[int, Incoming]
    works: list[Pending]


class Gossip(Method):
    """Decentralized SGD: each mixing step exchanges a sparsifier's message with the neighbours.

    The config picks the sparsifier (`cfg.sparsifier(seed)`); this class only schedules: post the
    exchange after the optimizer step, wait for it after the next backward pass, apply it.
    """

    around_the_step = True

    Config = DPSGDConfig
    cfg: DPSGDConfig
    averages_workers = True
    min_workers = 2

    @classmethod
    def check(cls, cfg, world: int) -> None:
        neighbours(cfg.topology, 0, world)  # raises for a topology the world size cannot form

    def setup(self, model):
        comm = self.ctx.comm
        self.model = model
        comm.broadcast_state(model, src=0, tag="init")
        self.x = bind_flat_parameters(model)
        self.peers = neighbours(self.cfg.topology, comm.rank, comm.world)
        w = mixing_matrix(self.cfg.topology, comm.world)[comm.rank]
        self.w_self, self.w_peer = float(w[comm.rank]), {j: float(w[j]) for j in self.peers}
        self.timers, self.pending = Timers(), None  # the first exchange is posted at the first mixing step
        self.sparsifier = self.cfg.sparsifier(self.ctx.cfg.train.seed)
        self.codec = parse_codec(self.cfg.codec, seed=self.ctx.cfg.train.seed * 1000 + comm.rank)
        self.sparsifier.bind(self.x, Mixing(comm.rank, self.peers, self.w_self, self.w_peer), self.timers,
                             self.codec)
        return model

    @property
    def copies(self) -> dict[int, torch.Tensor]:
        """The public copies of itself and its neighbours a sparsifier keeps (TopK), else none."""
        return getattr(self.sparsifier, "copies", {})

    def mixes_at(self, step: int) -> bool:
        return (step + 1) % self.cfg.sync_every == 0

    def _post(self, step: int) -> None:
        if self.mixes_at(step):
            self.pending = self._send(self.sparsifier.message(step))

    def _send(self, msg: Message) -> Exchange:
        """Post `msg` to every neighbour: parts of per-node length after their lengths, then the rest."""
        comm, sized = self.ctx.comm, msg.sized_parts()
        t0 = time.perf_counter()
        got, works = comm.exchange_sized_async(self.peers, sized, "index") if sized else ({j: [] for j in self.peers}, [])
        self.timers.add("comm", t0)
        if not msg.sized:  # every node knows the values' length: straight into buffers like ours
            received = {j: torch.empty_like(msg.values) for j in self.peers}
            works.append(comm.exchange_async({j: msg.values for j in self.peers}, received, "params"))
            for j in self.peers:
                got[j].append(received[j])
        index = (lambda j: got[j][0]) if msg.index is not None else (lambda j: None)
        return Exchange(msg, {j: Incoming(got[j][-1], index(j)) for j in self.peers}, works)

    def after_backward(self, step: int) -> None:
        if self.pending is None and self.mixes_at(step):
            self._post(step)  # first step, or just resumed: nothing was posted in advance
        if self.pending is None:
            return
        t0 = time.perf_counter()
        for work in self.pending.works:
            work.wait()
        self.timers.add("comm", t0)
        t0 = time.perf_counter()
        self.sparsifier.apply(self.pending.msg, self.pending.incoming)
        self.timers.add("expand", t0)
        self.pending = None

    def after_step(self, step: int) -> None:
        if step + 1 < self.ctx.total_steps:  # nothing to post after the last step
            self._post(step + 1)

    def end_epoch(self, epoch: int) -> dict:
        out = {"gossip_s": {k: round(v, 4) for k, v in self.timers.items()}}
        self.timers.clear()
        return out

    def global_model(self, final: bool):
        """The average of all nodes' models, for reporting (tag "eval": not part of the method)."""
        return averaged_copy(self.ctx.comm, self.model, tag="eval")

    def state_dict(self) -> dict:
        return {**self.sparsifier.state_dict(), "codec": self.codec.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sparsifier.load_state_dict(state)
        self.codec.load_state_dict(state.get("codec", {}))


@METHODS.register("dpsgd")
class DPSGD(Gossip):
    """D-PSGD: gossip with every coordinate (the Dense sparsifier)."""


@METHODS.register("rdpsgd")
class RDPSGD(Gossip):
    """RD-PSGD: gossip with a random subset of coordinates (the RandomK sparsifier)."""

    Config = RDPSGDConfig
    cfg: RDPSGDConfig
