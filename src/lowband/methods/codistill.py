"""Codistillation: models that learn from each other's stale checkpoints in shared storage.

Anil et al. 2018, "Large scale distributed neural network training through online distillation"
(papers/codistillation-notes.md). The K ranks form m = K / g models, each a group of g ranks that
allreduce gradients among themselves. Every N steps each model's first rank publishes a
checkpoint to the store (comm/store.py, tag "ckpt") and every rank loads the newest checkpoint
of each other model; those stale copies are its teachers until the next exchange. After a
burn-in of B steps the loss is CE(y, f_i(x)) + alpha * CE(mean_j softmax(f_j(x) / T), f_i(x)) T^2.
With `exchange = "server"` (the papers' other exchange) models never travel: each model's first rank
serves its model as of the last exchange, and every step each rank sends its batch's inputs to the
peers' servers and reads back their logits (distill/peer_answers.py, distill/predictions.py).
Models never meet in a collective, so one that dies or falls behind does not stop the others:
they keep its last good checkpoint and say so. Data: `same` (every model sees all data, in its
own order) or `partitioned` (disjoint shards); a model's shard is split over its g ranks.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from lowband.comm.rendezvous import check_bindable
from lowband.comm.store import CheckpointStore
from lowband.config import MAX_TIMEOUT_S, MethodConfig, opt
from lowband.distill.losses import codistill_loss
from lowband.distill.peer_answers import PeerAnswers
from lowband.errors import ConfigError
from lowband.methods.base import Method
from lowband.registry import METHODS

MIN_ANSWER_S = 0.01  # the shortest wait for a peer's answer that a loopback round trip can meet


@dataclass(kw_only=True)
class CodistillConfig(MethodConfig):
    name: str = opt("codistill", "training method")
    group_size: int = opt(1, "g: ranks per model, which allreduce among themselves (m = K / g models)", bounds=">= 1")
    interval: int = opt(50, "N: steps between exchanges (checkpoints written and read, or the servers' models refreshed)",
                        bounds="1..100000")
    alpha: float = opt(1.0, "weight of the distillation term", bounds=">= 0")
    burn_in: int = opt(0, "B: steps of plain training before distillation starts", bounds=">= 0")
    data: Literal["same", "partitioned"] = opt("same", "same: every model sees all data; partitioned: disjoint shards")
    store: str = opt("", "checkpoint store: a directory or fsspec URL (default RUN_DIR/exchange)",
                     only=("exchange", "store", " (the prediction servers use no store: leave it empty)"))
    temperature: float = opt(1.0, "distillation temperature T", bounds="> 0")
    wait_s: float = opt(0.0, "lockstep: wait this long for peers' checkpoints (or answers) of the same "
                                    "step (0: take the newest)", bounds=f"[0, {MAX_TIMEOUT_S:g}]")
    codec: Literal["fp32", "fp16", "bf16", "int8"] = opt("fp32", "precision of what is exchanged: the checkpoints "
                                                                  "written to the store, or the server's answers "
                                                                  "(fp16/bf16: half the bytes, int8 about a quarter; "
                                                                  "read back as float32)")
    exchange: Literal["store", "server"] = opt("store", "store: every N steps each model writes its checkpoint and "
                                                        "every rank loads its peers'; server: each model serves its "
                                                        "model and every rank asks the peers' servers for their "
                                                        "outputs on each batch")
    answer_topk: int = opt(0, "exchange=server, codistill: the server sends each row's k largest logits only "
                              "(0, or k >= the classes or vocabulary: all; the rest read as probability 0)", bounds=">= 0",
                         only=("exchange", "server", " (the store sends whole checkpoints)"))
    server_host: str = opt("127.0.0.1", "exchange=server: the interface the prediction servers bind (0.0.0.0 for "
                                        "workers on several machines)")
    server_timeout_s: float = opt(30.0, "exchange=server: a peer that does not answer within this many seconds is "
                                        "skipped (training goes on without its term) until the next exchange",
                                  bounds=f"[{MIN_ANSWER_S:g}, {MAX_TIMEOUT_S:g}]",
                                  note=" s: no answer comes back sooner, so every peer's term would be dropped and "
                                       "distillation would be off")


class TappedModel(torch.nn.Module):
    """Runs features then head and keeps the features of the last forward, for feature-space losses."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module: Any = module  # a FeatureModel (models/base.py): features and head
        self.features: torch.Tensor | None = None

    def forward(self, x):
        self.features = self.module.features(x)
        return self.module.head(self.features)


@METHODS.register("codistill")
class Codistill(Method):
    Config = CodistillConfig
    cfg: CodistillConfig
    min_workers = 2
    same_init = False
    independent_models = True

    @classmethod
    def check(cls, cfg, world: int) -> None:
        g = cfg.group_size
        if world % g or world // g < 2:
            raise ConfigError("method.group_size", g, f"must divide the {world} workers into at least 2 models")
        if cfg.store and cfg.exchange == "store":
            CheckpointStore(cfg.store)  # unreachable or read-only: fail before any worker starts
        if cfg.exchange == "server":
            check_bindable(cfg.server_host, "method.server_host")

    @classmethod
    def groups(cls, cfg, world: int) -> list[list[int]]:
        """Model m is ranks m*g .. m*g+g-1."""
        g = cfg.group_size
        return [list(range(m * g, (m + 1) * g)) for m in range(world // g)]

    @classmethod
    def partition(cls, cfg, labels, world: int, seed: int):
        models, g = world // cfg.group_size, cfg.group_size
        rng = np.random.default_rng(seed)
        n = len(labels)
        per_model = [np.arange(n)] * models if cfg.data == "same" else np.array_split(rng.permutation(n), models)
        return [torch.as_tensor(np.sort(part)) for shard in per_model for part in np.array_split(rng.permutation(shard), g)]

    # ---- set-up --------------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module) -> torch.nn.Module:
        comm, g = self.ctx.comm, self.cfg.group_size
        self.model_id, self.models = comm.rank // g, comm.world // g
        self.group = comm.split(self.groups(self.cfg, comm.world))
        self.net = self.wrap(model)
        self.model = self.group.data_parallel(self.net, tag="grad") if g > 1 else self.net
        self._has_buffers = any(b.is_floating_point() for b in model.buffers())
        self.peers: PeerAnswers | None = None
        if self.cfg.exchange == "server":
            self.peers = PeerAnswers(self.cfg, comm, self.groups(self.cfg, comm.world), self.local_model(),
                                     self.ctx.data, self.answers_features, self.ctx.log)
        else:
            url = self.cfg.store or self.ctx.run.file("exchange")
            self.store = CheckpointStore(url, comm, self.ctx.log, dtype=self.cfg.codec)
            # a peer's shard may hold a batch more an epoch than this one's: past that no peer can have written
            self.store.last_step = self.ctx.total_steps + self.ctx.cfg.train.epochs
        self.teachers: dict[int, Any] = {}  # peer id -> its last model (a FeatureModel, models/base.py)
        self.teacher_step: dict[int, int] = {}
        self.silent: set[int] = set()
        self.sums: dict[str, float] = {}
        return self.model

    answers_features = False  # what a prediction server answers: logits (codistillation) or features (AFSD)

    def wrap(self, model):
        return model

    def local_model(self):
        return self.net.module if isinstance(self.net, TappedModel) else self.net

    # ---- the loss --------------------------------------------------------------------------------
    def loss(self, batch, outputs, loss):
        self._add("ce", loss.item())
        started = self.teachers if self.peers is None else self.exchanged > 0  # both begin at the first exchange
        if not started or self.steps_done < self.cfg.burn_in:
            return loss
        term = self.distill_term(batch.x, outputs)
        if term is None:  # no peer's server answered
            return loss
        self._add("distill_loss", term.item())
        return loss + self.cfg.alpha * term

    def distill_term(self, x, outputs):
        peers = self.peer_outputs(x)
        return codistill_loss(outputs, peers, self.cfg.temperature) if peers else None

    def peer_outputs(self, x) -> list[torch.Tensor]:
        """The peers' outputs on `x`: from their servers, or from their stored checkpoints run here."""
        if self.peers is not None:
            return self.peers.ask(x, self.exchanged if self.cfg.wait_s > 0 else 0)
        with torch.no_grad():
            return [t(x) for t in self.teachers.values()]

    def _add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value
        self.sums[key + "#"] = self.sums.get(key + "#", 0) + 1

    # ---- the exchange ----------------------------------------------------------------------------
    steps_done = 0
    exchanged = 0  # the step of the last exchange

    def after_backward(self, step: int) -> None:
        if self.cfg.group_size > 1:
            self.group.settle_async("grad")

    def after_step(self, step: int) -> None:
        self.steps_done = step + 1
        if self.peers is not None:
            self.peers.settle()
        if self._has_buffers and self.cfg.group_size > 1:
            self.group.broadcast_state(self.local_model(), src=0, tag="buffers", buffers_only=True)
        if (step + 1) % self.cfg.interval == 0:
            self.exchange(step + 1)

    def exchange(self, step: int) -> None:
        self.exchanged = step
        if self.peers is not None:
            self.peers.publish(step, self.local_model())
            self.peers.reconnect()
            return
        if self.group.rank == 0:
            self.store.publish(self.model_id, step, self.local_model().state_dict())
        deadline = time.monotonic() + self.cfg.wait_s
        for peer in range(self.models):
            if peer != self.model_id:
                self._refresh(peer, step, deadline)

    def _refresh(self, peer: int, step: int, deadline: float) -> None:
        while max(self.store.versions(peer), default=-1) < step and time.monotonic() < deadline:
            time.sleep(0.05)  # poll the listing, not the files: each exchange reads a peer at most once
        newer_than = self.teacher_step.get(peer, -1)
        # lockstep (wait_s > 0): the peer as of this very step, even if it has already moved on
        found = self.store.load_newest(peer, newer_than, at_most=step if self.cfg.wait_s > 0 else None,
                                       like=self.local_model().state_dict())
        if found is None:
            if newer_than >= 0 and step - newer_than >= 2 * self.cfg.interval and peer not in self.silent:
                self.silent.add(peer)  # said once, until the peer publishes again
                self.ctx.log.warning(f"model {self.model_id}: peer model {peer} has published nothing newer than step "
                                     f"{newer_than} (now step {step}); still distilling from that checkpoint")
            return
        self.silent.discard(peer)
        version, state = found
        if peer not in self.teachers:
            self.teachers[peer] = copy.deepcopy(self.local_model()).eval().requires_grad_(False)
        self.teachers[peer].load_state_dict(state)
        self.teacher_step[peer] = version

    def end_training(self) -> None:
        if self.peers is not None:
            self.peers.finish()

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()

    # ---- reporting -------------------------------------------------------------------------------
    def end_epoch(self, epoch: int) -> dict:
        out: dict = {k: self.sums[k] / self.sums[k + "#"] for k in self.sums if not k.endswith("#")}
        steps = self.peers.versions if self.peers is not None else self.teacher_step
        out["teacher_steps"] = {str(k): v for k, v in sorted(steps.items())}
        if self.peers is not None:
            out.update(self.peers.figures())
        self.sums = {}
        return out

    def state_dict(self) -> dict:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict) -> None:
        """On resume, take each peer's newest checkpoint as teacher again (or serve this model again)."""
        self.steps_done = state["steps_done"]
        self.exchanged = self.steps_done // self.cfg.interval * self.cfg.interval
        if self.peers is not None:
            self.peers.publish(self.exchanged, self.local_model())
            return
        for peer in range(self.models):
            if peer != self.model_id:
                self._refresh(peer, self.steps_done, time.monotonic())
