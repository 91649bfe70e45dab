"""E-DNN: K models trained independently, combined by averaging their outputs at the end.

The ensemble baseline of Sun et al., "Ensemble-Compression" (after Hansen & Salamon). Workers
start from different random weights and never communicate while training; the global model
(_G) is the simple output ensemble of the K final models, built with one all-gather of the
models (tag "params"); _L is the worker with the smallest training loss. Per-epoch global
accuracies are measured with gathers tagged "eval" (bookkeeping, not the method's cost).
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband.comm.averaging import gather_models
from lowband.config import MethodConfig, opt
from lowband.distill.ensemble import Ensemble
from lowband.methods.base import Method
from lowband.registry import METHODS


@dataclass(kw_only=True)
class EnsembleConfig(MethodConfig):
    name: str = opt("ensemble", "training method")


@METHODS.register("ensemble")
class IndependentEnsemble(Method):
    Config = EnsembleConfig
    cfg: EnsembleConfig
    same_init = False
    min_workers = 2

    def global_model(self, final: bool):
        return Ensemble(gather_models(self.ctx.comm, self.model, tag="params" if final else "eval"))
