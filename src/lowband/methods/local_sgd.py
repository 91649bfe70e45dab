"""MA-DNN (model averaging, local SGD, FedAvg): average the models every tau local steps.

From Sun et al., "Ensemble-Compression: A New Method for Parallel Training of Deep Neural
Networks" (the MA-DNN baseline), after McMahan et al. and Povey et al. Every worker runs plain
SGD on its own data; after every tau steps all parameters and floating buffers (BatchNorm
statistics) are averaged with one allreduce (tag "params") and every worker continues from the
average. tau = 1 is parameter averaging after every step. The global model (_G) is the average,
the local one (_L) the worker with the smallest training loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband.config import opt
from lowband.comm.averaging import average_models, averaged_copy
from lowband.methods.base import Method
from lowband.methods.rounds import RoundLog, RoundsConfig
from lowband.registry import METHODS


@dataclass(kw_only=True)
class LocalSGDConfig(RoundsConfig):
    name: str = opt("local_sgd", "training method")


@METHODS.register("local_sgd")
class LocalSGD(Method):
    Config = LocalSGDConfig
    averages_workers = True
    min_workers = 2

    def setup(self, model):
        self.model = model
        self.ctx.comm.broadcast_state(model, src=0, tag="init")
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        return model

    def after_step(self, step: int) -> None:
        if (step + 1) % self.cfg.tau:
            return
        round_no = (step + 1) // self.cfg.tau
        local = self.rounds.local_accuracies(self.model) if self.rounds.due(round_no) else None
        average_models(self.ctx.comm, self.model, tag="params")
        if local is not None:
            self.rounds.write(round_no, step + 1, local, self.model)

    def global_model(self, final: bool):
        return averaged_copy(self.ctx.comm, self.model, tag="params" if final else "eval")
