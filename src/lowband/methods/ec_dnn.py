"""EC-DNN: local SGD whose rounds aggregate by output ensemble and compress back by distillation.

Sun, Tian et al., "Ensemble-Compression: A New Method for Parallel Training of Deep Neural
Networks". Workers start from different weights. A round is tau optimizer steps. At the end
of a round every worker all-gathers the K local models (tag "params"), forms the global model
G(x) = sum_k a_k softmax(f_k(x)) with simple, regression or margin weights, and relabels a
random fraction mu of its own data with G. The next round starts with compression: for
c = max(1, round(p * tau)) steps, still from the worker's own weights, the loss is
CE(y, f) + beta * CE(G(x), f) on relabelled samples. Then the compressed models are gathered
once more (tag "params") and their mean output z on the relabelled samples is cached; the rest
of the round minimises CE(y, f) - alpha * ||softmax(f) - z||^2, which keeps the local models
diverse. Total compression steps are thus p of all steps, as in the paper. Reported: _G (the
ensemble; margin weights need labels, so at test time margin ensembles use 1/K) and _L.
With `codec` (fp16, int8, ...) the gathered models travel encoded (comm/value_codecs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from lowband.comm.averaging import gather_models
from lowband.comm.value_codecs import DENSE, VALUE_SPECS, parse_codec
from lowband.config import Form, opt
from lowband.distill.ensemble import Ensemble
from lowband.distill.losses import diversity_penalty, ensemble_weights, soft_cross_entropy
from lowband.methods.base import Method
from lowband.methods.rounds import RoundLog, RoundsConfig
from lowband.registry import METHODS


@dataclass(kw_only=True)
class ECDNNConfig(RoundsConfig):
    name: str = opt("ec_dnn", "training method")
    tau: int = opt(64, "local steps per round (64 = about 2 epochs of MNIST-1D with 4 workers: ~15 rounds in 30 epochs)")
    ensemble: Literal["simple", "regression", "margin"] = opt("simple", "how the K local models' outputs are weighted")
    alpha: float = opt(0.6, "weight of the diversity term in local training", bounds=">= 0")
    beta: float = opt(0.4, "weight of the distillation term during compression", bounds=">= 0")
    p: float = opt(0.1, "compression length as a fraction of all steps (p * tau steps per round)", bounds="(0, 1]")
    mu: float = opt(0.7, "fraction of the local data relabelled by the ensemble each round", bounds="(0, 1]")
    codec: str = opt("fp32", "how the models travel at each gather (whole models: no top-k)",
                     form=Form(f"a dense codec: {VALUE_SPECS}", DENSE, note=" (ec_dnn gathers whole models)"))


@METHODS.register("ec_dnn")
class ECDNN(Method):
    Config = ECDNNConfig
    cfg: ECDNNConfig
    same_init = False
    min_workers = 2
    language_model_refused = ("its compression stage keeps the ensemble's soft labels for every training sample, "
                              "which for a language model is windows x context x 256 values; use ensemble or codistill")

    def setup(self, model):
        self.model = model
        self.codec = parse_codec(self.cfg.codec, seed=self.ctx.cfg.train.seed * 1000 + self.ctx.comm.rank)
        data = self.ctx.data
        assert data is not None, "the trainer gives every method its data"
        n, classes = len(data.y_train), data.num_classes
        self.pseudo = torch.zeros(n, classes, device=self.ctx.device)   # ensemble outputs ybar
        self.target = torch.zeros(n, classes, device=self.ctx.device)   # compressed models' mean output z
        self.relabelled = torch.zeros(n, dtype=torch.bool, device=self.ctx.device)
        self.has_target = torch.zeros(n, dtype=torch.bool, device=self.ctx.device)
        self.compress_left = 0
        self.compress_steps = max(1, round(self.cfg.p * self.cfg.tau))
        self.test_weights = None
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        return model

    # ---- the loss -------------------------------------------------------------------------------
    def loss(self, batch, outputs, loss):
        ids = batch.ids.to(self.ctx.device)
        if self.compress_left > 0:
            mask = self.relabelled[ids]
            term = soft_cross_entropy(outputs[mask], self.pseudo[ids[mask]]).sum() / len(ids)
            return loss + self.cfg.beta * term
        mask = self.has_target[ids]
        if not mask.any():
            return loss
        term = diversity_penalty(outputs[mask], self.target[ids[mask]]).sum() / len(ids)
        return loss + self.cfg.alpha * term

    # ---- the schedule ---------------------------------------------------------------------------
    def after_step(self, step: int) -> None:
        if self.compress_left > 0:
            self.compress_left -= 1
            if self.compress_left == 0:
                self._cache_compressed_outputs()
        if (step + 1) % self.cfg.tau == 0:
            self._end_round((step + 1) // self.cfg.tau, step + 1)

    def _end_round(self, round_no: int, step: int) -> None:
        members = gather_models(self.ctx.comm, self.model, tag="params", codec=self.codec)
        ids = self._relabel_subset(round_no)
        x, y = self._local(ids)
        probs = Ensemble(members).member_probs(x)
        weights = ensemble_weights(probs, y, self.cfg.ensemble)
        self.pseudo[ids] = (weights[:, :, None] * probs).sum(0)
        self.relabelled.zero_()
        self.relabelled[ids] = True
        self.test_weights = self._test_weights(weights)
        self.compress_left = self.compress_steps
        if self.rounds.due(round_no):
            local = self.rounds.local_accuracies(self.model)
            self.rounds.write(round_no, step, local, Ensemble(members, self.test_weights), ensemble=self.cfg.ensemble)

    def _cache_compressed_outputs(self) -> None:
        members = gather_models(self.ctx.comm, self.model, tag="params", codec=self.codec)
        ids = self.relabelled.nonzero().squeeze(1)
        x, _ = self._local(ids)
        self.target[ids] = Ensemble(members).member_probs(x).mean(0)
        self.has_target.zero_()
        self.has_target[ids] = True

    def _relabel_subset(self, round_no: int) -> torch.Tensor:
        shard = self.ctx.shard
        assert shard is not None, "EC-DNN runs with its shard in the context"
        gen = torch.Generator().manual_seed(self.ctx.cfg.train.seed * 7_919 + round_no * 104_729 + self.ctx.comm.rank)
        count = max(1, round(self.cfg.mu * len(shard)))
        return shard[torch.randperm(len(shard), generator=gen)[:count]].to(self.ctx.device)

    def _local(self, ids: torch.Tensor):
        d = self.ctx.data
        assert d is not None, "EC-DNN runs with its data in the context"
        return d.x_train[ids.cpu()].to(self.ctx.device), d.y_train[ids.cpu()].to(self.ctx.device)

    def _test_weights(self, weights: torch.Tensor) -> torch.Tensor:
        """Per-model weights usable without labels: the regression alpha averaged over ranks, else 1/K."""
        k = weights.shape[0]
        if self.cfg.ensemble != "regression":
            return torch.full((k,), 1.0 / k)
        alphas = self.ctx.comm.all_gather(weights[:, 0].contiguous().double(), tag="params")
        return torch.stack(alphas).mean(0).float().cpu()

    # ---- reporting and resuming -----------------------------------------------------------------
    def global_model(self, final: bool):
        members = gather_models(self.ctx.comm, self.model, tag="params" if final else "eval", codec=self.codec)
        weights = self.test_weights if self.test_weights is not None else torch.full((len(members),), 1 / len(members))
        return Ensemble(members, weights)

    def state_dict(self) -> dict:
        return {"pseudo": self.pseudo, "target": self.target, "relabelled": self.relabelled,
                "has_target": self.has_target, "compress_left": self.compress_left,
                "test_weights": self.test_weights if self.test_weights is not None else torch.empty(0),
                "codec": self.codec.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for key in ("pseudo", "target", "relabelled", "has_target"):
            getattr(self, key).copy_(state[key])
        self.compress_left = state["compress_left"]
        self.test_weights = state["test_weights"] if state["test_weights"].numel() else None
        self.codec.load_state_dict(state.get("codec", {}))

