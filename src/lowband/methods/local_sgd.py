"""MA-DNN (model averaging, local SGD, FedAvg): average the models every tau local steps.

From Sun et al., "Ensemble-Compression: A New Method for Parallel Training of Deep Neural
Networks" (the MA-DNN baseline), after McMahan et al. and Povey et al. Every worker runs plain
SGD on its own data; after every tau steps all parameters and floating buffers (BatchNorm
statistics) are averaged with one allreduce (tag "params") and every worker continues from the
average. tau = 1 is parameter averaging after every step. With a lossy `codec` the workers send
their change since the last average (θ_avg - θ_local) compressed, with error feedback: the same
average, in fewer bytes (this is DiLoCo with outer lr 1 and no momentum, methods/diloco.py).
`tau_schedule` lets tau grow during the run (methods/outer.py), as Gu et al. (ICLR 2024) argue
local SGD should while its learning rate decays. The global model (_G) is the average,
the local one (_L) the worker with the smallest training loss.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband.comm.averaging import averaged_copy
from lowband.comm.value_codecs import SPEC_HELP, parse_codec
from lowband.config import opt
from lowband.methods.base import Method
from lowband.methods.outer import SCHEDULE_HELP, Fragment, OuterStep, TauSchedule, parse_tau_schedule
from lowband.methods.rounds import RoundLog, RoundsConfig
from lowband.models.flat import state_tensors
from lowband.registry import METHODS


@dataclass(kw_only=True)
class LocalSGDConfig(RoundsConfig):
    name: str = opt("local_sgd", "training method")
    codec: str = opt("fp32", f"how each worker's change since the last average travels: {SPEC_HELP}")
    error_feedback: bool = opt(True, "keep what a lossy codec dropped and send it with the next average")
    tau_schedule: str = opt("", f"a tau that grows during the run (Gu et al. 2024's QSR in fixed phases): {SCHEDULE_HELP}")

    def __post_init__(self):
        super().__post_init__()
        parse_codec(self.codec, "method.codec")
        parse_tau_schedule(self.tau_schedule, self.tau)


@METHODS.register("local_sgd")
class LocalSGD(Method):
    Config = LocalSGDConfig
    cfg: LocalSGDConfig
    averages_workers = True
    min_workers = 2

    @classmethod
    def outer_step(cls, cfg: LocalSGDConfig) -> OuterStep:
        """The model average: outer lr 1, no momentum, buffers averaged with the parameters."""
        return OuterStep(lr=1.0, momentum=0.0, nesterov=False, buffers_apart=False)

    def setup(self, model):
        self.model = model
        self.ctx.comm.broadcast_state(model, src=0, tag="init")
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        codec = parse_codec(self.cfg.codec, seed=self.ctx.cfg.train.seed * 1000 + self.ctx.comm.rank)
        self.average = Fragment(state_tensors(model), 1.0, 0.0, codec, self.cfg.error_feedback)
        self.schedule = TauSchedule(self.cfg.tau_schedule, self.cfg.tau)
        self.outer_steps = 0
        return model

    def after_step(self, step: int) -> None:
        if step + 1 - self.average.sent_at < self.schedule.at((step + 1) / self.ctx.total_steps):
            return
        self.outer_steps += 1
        round_no = self.outer_steps
        local = self.rounds.local_accuracies(self.model) if self.rounds.due(round_no) else None
        self.average.sync(self.ctx.comm, "params", step + 1, 0)
        self.average.merge(1.0)
        if local is not None:
            self.rounds.write(round_no, step + 1, local, self.model)

    def end_epoch(self, epoch: int) -> dict:
        return {"outer_steps": self.outer_steps}

    def state_dict(self) -> dict:
        return {"average": self.average.state_dict(), "outer_steps": self.outer_steps}

    def load_state_dict(self, state: dict) -> None:
        if "average" in state:
            self.average.load_state_dict(state["average"])
        self.outer_steps = int(state.get("outer_steps", self.average.sent_at // self.cfg.tau))

    def global_model(self, final: bool):
        return averaged_copy(self.ctx.comm, self.local_model(), tag="params" if final else "eval")
