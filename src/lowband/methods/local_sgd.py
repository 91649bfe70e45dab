"""MA-DNN (model averaging, local SGD, FedAvg): average the models every tau local steps.

From Sun et al., "Ensemble-Compression: A New Method for Parallel Training of Deep Neural
Networks" (the MA-DNN baseline), after McMahan et al. and Povey et al. Every worker runs plain
SGD on its own data; after every tau steps all parameters and floating buffers (BatchNorm
statistics) are averaged with one allreduce (tag "params") and every worker continues from the
average. tau = 1 is parameter averaging after every step. With a lossy `codec` the workers send
their change since the last average (θ_avg - θ_local) compressed, with error feedback: the same
average, in fewer bytes (this is DiLoCo with outer lr 1 and no momentum, methods/diloco.py).
`tau_schedule` lets tau grow during the run (methods/outer.py), as Gu et al. (ICLR 2024) argue
local SGD should while its learning rate decays. The global model (_G) is the last average (at the
run's end, the steps since it averaged once more), the local one (_L) the worker with the smallest
training loss. Its averages are outer steps a quorum takes (comm/quorum.py): every rank of a fixed
world, or an elastic job's members.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband.comm.quorum import Round
from lowband.comm.value_codecs import SPEC_HELP, parse_codec
from lowband.config import Form, opt
from lowband.methods.outer import SCHEDULE_HELP, Fragment, OuterMethod, SyncPlan, parse_tau_schedule, with_anchors
from lowband.methods.rounds import RoundLog, RoundsConfig
from lowband.models.flat import state_tensors
from lowband.registry import METHODS


@dataclass(kw_only=True)
class LocalSGDConfig(RoundsConfig):
    name: str = opt("local_sgd", "training method")
    codec: str = opt("fp32", "how each worker's change since the last average travels",
                     form=Form(SPEC_HELP, parse=parse_codec))
    error_feedback: bool = opt(True, "keep what a lossy codec dropped and send it with the next average")
    tau_schedule: str = opt("", f"a tau that grows during the run (Gu et al. 2024's QSR in fixed phases): {SCHEDULE_HELP}")

    def __post_init__(self):
        super().__post_init__()
        parse_tau_schedule(self.tau_schedule, self.tau)


@METHODS.register("local_sgd")
class LocalSGD(OuterMethod):
    Config = LocalSGDConfig
    cfg: LocalSGDConfig
    averages_workers = True
    around_the_step = True
    min_workers = 2
    #: the workers the rate is scaled for: the launched ones, or in an elastic job the last round's
    #: contributors (elastic.scale_with_quorum); None until a round says otherwise
    scale: float | None = None

    @classmethod
    def check_elastic(cls, cfg: LocalSGDConfig) -> None:
        pass  # every option: its averages are outer steps through the job's quorum

    def setup(self, model):
        self.model = model
        self.ctx.comm.broadcast_state(model, src=0, tag="init")
        self.quorum = self.ctx.quorum(self.ctx.comm)
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        codec = parse_codec(self.cfg.codec, seed=self.ctx.cfg.train.seed * 1000 + self.ctx.rank)
        self.average = Fragment(state_tensors(model), 1.0, 0.0, codec, self.cfg.error_feedback)
        self.plan = SyncPlan(self.cfg.tau, 1, self.cfg.tau_schedule, self.ctx.total_steps)
        self.steps = self.outer_steps = 0  # the outer clock (inner steps since the run began) and averages
        return model

    def lr_scale(self) -> float:
        """Linear scaling by the workers whose models the average takes: the launched ones, or in an elastic
        job with elastic.scale_with_quorum the last round's contributors (at most the launched ones), so a
        worker left alone trains at one worker's rate."""
        return self.scale or float(self.ctx.width)

    def _follow(self, rnd: Round) -> None:
        elastic = self.ctx.cfg.elastic
        if rnd.contributors and elastic.on and elastic.scale_with_quorum:
            self.scale = float(min(rnd.contributors, self.ctx.width))

    def after_step(self, step: int) -> None:
        self.steps += 1  # the outer clock: a receiver in an elastic job takes the source's
        if self.plan.ends_round(self.steps):
            self.quorum.outer_step(self._exchange, self)

    def _exchange(self, rnd: Round) -> None:
        """One model average over the round: θ_global <- θ_global - mean(θ_global - θ_local)."""
        self.outer_steps += 1
        self._follow(rnd)
        local = self.rounds.local_accuracies(self.model, rnd.comm) if self.rounds.due(self.outer_steps) else None
        self.average.reduce_and_step(rnd.comm, "params", rnd.contributors, rnd.contributes)
        self.average.schedule(self.steps, 0)
        self.average.merge(1.0)
        if local is not None:
            self.rounds.write(self.outer_steps, self.steps, local, self.model, rnd.comm)

    def end_epoch(self, epoch: int) -> dict:
        return {"outer_steps": self.outer_steps}

    def global_model(self, final: bool):
        """The last average; at the end, the steps since it averaged once more (on the side)."""
        if final and self.average.sent_at < self.steps:
            saved = self.average.state_dict()
            self.quorum.outer_step(self._last_average, self)
            glob = self._averaged()
            self.average.load_state_dict(saved)
            return glob
        return self._averaged()

    def _last_average(self, rnd: Round) -> None:
        self.average.reduce_and_step(rnd.comm, "params", rnd.contributors, rnd.contributes)

    def _averaged(self):
        return with_anchors(self.local_model(), [self.average])

    # ---- the outer state a quorum handles (comm/quorum.py's OuterState) ----------------------------
    def _shared(self) -> dict:
        return {"average": self.average.shared_state(), "scale": self.scale or 0.0}

    def _receive(self, shared: dict, extra: dict) -> None:
        self.average.load_shared(shared["average"])
        self.average.merge(1.0)
        self.scale = float(shared.get("scale", 0.0)) or None

    def state_dict(self) -> dict:
        return {"average": self.average.state_dict(), "outer_steps": self.outer_steps, "steps": self.steps,
                "scale": self.scale or 0.0}

    def load_state_dict(self, state: dict) -> None:
        if "average" in state:
            self.average.load_state_dict(state["average"])
        self.outer_steps = int(state.get("outer_steps", self.average.sent_at // self.cfg.tau))
        self.steps = int(state.get("steps", self.average.sent_at))
        self.scale = float(state.get("scale", 0.0)) or None
