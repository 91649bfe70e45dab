"""D-PSGD and RD-PSGD: decentralized SGD where each node mixes with its neighbours only.

D-PSGD is Lian et al. 2017, "Can Decentralized Algorithms Outperform Centralized Algorithms?";
RD-PSGD is the randomized variant of papers/rd-psgd-randomized-decentralized.txt. At step t
node i computes its gradient g_i at x_i, mixes x_i <- sum_j W_ij x_j over itself and its
neighbours (W symmetric, doubly stochastic; comm/topology.py) and then takes the optimizer step
with g_i. RD-PSGD mixes only a random subset of coordinates, each kept with probability p and
the same on every node in a step; the rest keep their local value. The subset comes from a
seed shared by all nodes and the step number, so in `seed` mode no index crosses the wire;
`gaps` and `bitmask` send the indices as the paper does (comm/codecs.py). With p = 1 RD-PSGD is
D-PSGD exactly. `sync_every = s` mixes only every s-th step. The exchange for a step is posted
right after the previous optimizer step and waited for after backward, so it overlaps with the
forward and backward pass. Bytes: "params" (values) and "index" (indices and length headers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import torch

from lowband.comm.averaging import averaged_copy
from lowband.comm.codecs import INDEX_CODECS
from lowband.comm.masks import random_indices
from lowband.comm.topology import mixing_matrix, neighbours
from lowband.config import MethodConfig, opt
from lowband.errors import require
from lowband.methods.base import Method
from lowband.models.flat import bind_flat_parameters
from lowband.registry import METHODS


@dataclass(kw_only=True)
class DPSGDConfig(MethodConfig):
    name: str = opt("dpsgd", "training method")
    topology: Literal["ring", "torus", "complete"] = opt("ring", "who mixes with whom")
    sync_every: int = opt(1, "mix every this many steps (the synchronisation delay s)")

    def __post_init__(self):
        require(self.sync_every >= 1, "method.sync_every", self.sync_every, "must be an integer >= 1")


@dataclass(kw_only=True)
class RDPSGDConfig(DPSGDConfig):
    name: str = opt("rdpsgd", "training method")
    p: float = opt(0.1, "fraction of coordinates mixed per step (the sparsity ratio)")
    index: Literal["seed", "gaps", "bitmask"] = opt("seed", "how the receiver learns the indices")
    sampler: Literal["geometric", "bernoulli"] = opt("geometric", "index generation: O(p d) skips or O(d) draws")

    def __post_init__(self):
        super().__post_init__()
        require(0 < self.p <= 1, "method.p", self.p, "must be in (0, 1]")


@dataclass
class Exchange:
    """One step's exchange in flight: the mixed coordinates, what arrives, and the pending work."""

    idx: torch.Tensor | None
    index_in: dict | None
    received: dict
    work: object


class Timers(dict):
    """Seconds per phase of the exchange: index, extract, comm, expand (and select for TopK)."""

    def add(self, phase: str, t0: float) -> None:
        self[phase] = self.get(phase, 0.0) + time.perf_counter() - t0


@METHODS.register("dpsgd")
class DPSGD(Method):
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
        return model

    def mixes_at(self, step: int) -> bool:
        return (step + 1) % self.cfg.sync_every == 0

    # ---- what is exchanged ----------------------------------------------------------------------
    def indices(self, step: int) -> torch.Tensor | None:
        """Coordinates mixed at `step`; None: all of them."""
        return None

    def _post(self, step: int) -> None:
        if not self.mixes_at(step):
            return
        t0 = time.perf_counter()
        idx = self.indices(step)
        self.timers.add("index", t0)
        t0 = time.perf_counter()
        values = self.x.clone() if idx is None else self.x[idx]
        self.timers.add("extract", t0)
        index_in = self._send_indices(idx)
        received = {j: torch.empty_like(values) for j in self.peers}
        work = self.ctx.comm.exchange_async({j: values for j in self.peers}, received, "params")
        self.pending = Exchange(idx, index_in, received, work)

    def _send_indices(self, idx) -> dict | None:
        return None

    # ---- hooks ----------------------------------------------------------------------------------
    def after_backward(self, step: int) -> None:
        if self.pending is None and self.mixes_at(step):
            self._post(step)  # first step, or just resumed: nothing was posted in advance
        if self.pending is None:
            return
        idx, index_in, received = self.pending.idx, self.pending.index_in, self.pending.received
        t0 = time.perf_counter()
        self.pending.work.wait()
        self.timers.add("comm", t0)
        self._check_indices(idx, index_in)
        t0 = time.perf_counter()
        with torch.no_grad():
            target = self.x if idx is None else self.x[idx]
            mixed = self.w_self * target
            for j, values in received.items():
                mixed.add_(values, alpha=self.w_peer[j])
            if idx is None:
                self.x.copy_(mixed)
            else:
                self.x[idx] = mixed
        self.timers.add("expand", t0)
        self.pending = None

    def _check_indices(self, idx, index_in) -> None:
        pass

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


@METHODS.register("rdpsgd")
class RDPSGD(DPSGD):
    Config = RDPSGDConfig
    cfg: RDPSGDConfig

    def setup(self, model):
        self.codec = INDEX_CODECS[self.cfg.index]()
        return super().setup(model)

    def indices(self, step: int) -> torch.Tensor | None:
        if self.cfg.p == 1.0:
            return None
        gen = torch.Generator().manual_seed(mask_seed(self.ctx.cfg.train.seed, step))
        return random_indices(self.x.numel(), self.cfg.p, gen, self.cfg.sampler).to(self.x.device)

    def _send_indices(self, idx) -> dict | None:
        """gaps/bitmask: exchange payload lengths, then the encoded indices (tag "index")."""
        if idx is None or not self.codec.sends_indices:
            return None
        t0 = time.perf_counter()
        payload = self.codec.encode(idx.cpu(), self.x.numel())
        self.timers.add("index", t0)
        t0 = time.perf_counter()
        comm = self.ctx.comm
        lengths = {j: torch.zeros(1, dtype=torch.int64) for j in self.peers}
        comm.exchange({j: torch.tensor([payload.numel()]) for j in self.peers}, lengths, "index")
        received = {j: torch.empty(int(n.item()), dtype=torch.uint8) for j, n in lengths.items()}
        comm.exchange({j: payload for j in self.peers}, received, "index")
        self.timers.add("comm", t0)
        return received

    def _check_indices(self, idx, index_in) -> None:
        if index_in is None:
            return
        for j, payload in index_in.items():
            if not torch.equal(self.codec.decode(payload, self.x.numel()).to(idx.device), idx):
                raise RuntimeError(f"indices from rank {j} differ from this rank's: the shared mask seed diverged")


def mask_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s mask, the same on every node."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1)
