"""DiLoCo and Streaming DiLoCo: local steps, then an outer optimizer on the averaged pseudo-gradient.

From Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models" (2023)
and "Streaming DiLoCo with overlapping communication" (Douillard et al., 2025); compressed
pseudo-gradients as in INTELLECT-1 (int8) and SparseLoCo (top-k + 2-bit values + error feedback).

Every worker runs `tau` inner steps with the configured optimizer. Then the pseudo-gradient
Δ = θ_global - θ_local is averaged over the workers (through `codec`, with error feedback when
the codec is lossy) and an outer SGD with Nesterov momentum (`outer_lr`, `outer_momentum`;
`outer_nesterov=false` for heavy-ball) steps θ_global; every worker continues from θ_global.
Floating buffers (BatchNorm) are averaged. `tau_schedule` lets tau grow during the run and
`inner_lr_factor` sets the inner rate against the synchronous one (methods/outer.py, OuterConfig);
with `inner_lr_factor_end` the factor moves linearly to that value over the run's steps.
With one worker (M = 1) the outer step is a lookahead on one trajectory (Charles et al. 2025 find
it beats plain training), which separates that gain from parallelism.
Outer lr 1 with momentum 0 is local SGD exactly. The inner learning rate is not scaled with the
number of workers (the outer step already moves θ_global by about outer_lr / (1 - momentum) times
the mean change; scaling both diverged on MNIST-1D, BENCHMARKS.md).

Replicas: with `group_size = g` every g consecutive ranks form one replica that allreduces its
gradients every step (a site's fast link, as DiLoCo's "workers" are data-parallel groups); the
outer step runs between the replicas' first ranks and reaches the others by a broadcast inside
the replica (tag "params-group").

Streaming: `fragments = P` cuts the parameters into P consecutive groups synchronised in rotation,
each every tau steps, fragment p at steps (p + 1) tau / P (mod tau), so each sync sends 1/P of the
model. A fragment's result is merged `overlap` steps after it was sent (the exchange may run while
training goes on), as θ_local <- mix·θ_global + (1 - mix)·θ_local. The global model is θ_global.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lowband.comm.value_codecs import SPEC_HELP, parse_codec
from lowband.config import opt
from lowband.errors import ConfigError, require
from lowband.methods.base import Method
from lowband.methods.outer import Fragment, OuterConfig, OuterStep, TauSchedule, ramp, split_fragments, with_anchors
from lowband.methods.rounds import RoundLog
from lowband.registry import METHODS


@dataclass(kw_only=True)
class DiLoCoConfig(OuterConfig):
    name: str = opt("diloco", "training method")
    tau: int = opt(16, "inner steps between outer steps (H in the paper)")
    fragments: int = opt(1, "Streaming DiLoCo: parameter fragments synchronised in rotation (1: all at once)")
    overlap: int = opt(0, "steps between sending a fragment and merging its result; < tau / fragments")
    mix: float = opt(1.0, "merge weight of θ_global: θ_local <- mix·θ_global + (1 - mix)·θ_local, in (0, 1]")
    codec: str = opt("fp32", f"how pseudo-gradients travel: {SPEC_HELP}")
    error_feedback: bool = opt(True, "keep what a lossy codec dropped and send it with the next sync")
    group_size: int = opt(1, "ranks per replica, allreducing gradients every step; outer steps average the replicas")

    def __post_init__(self):
        super().__post_init__()
        require(1 <= self.fragments <= self.tau, "method.fragments", self.fragments,
                f"must be in [1, method.tau={self.tau}]")
        require(self.overlap >= 0 and (self.overlap == 0 or self.overlap < self.tau / self.fragments),
                "method.overlap", self.overlap, f"must be >= 0 and < tau / fragments = {self.tau / self.fragments:g}")
        require(0 < self.mix <= 1, "method.mix", self.mix, "must be in (0, 1]")
        parse_codec(self.codec, "method.codec")
        require(self.group_size >= 1, "method.group_size", self.group_size, "must be an integer >= 1")
        require(not self.tau_schedule or self.fragments == 1, "method.tau_schedule", self.tau_schedule,
                f"needs method.fragments=1 (streaming fragments keep a fixed tau); fragments={self.fragments}")


@METHODS.register("diloco")
class DiLoCo(Method):
    Config = DiLoCoConfig
    cfg: DiLoCoConfig
    @classmethod
    def check(cls, cfg: DiLoCoConfig, world: int) -> None:
        g = cfg.group_size
        if world % g:
            raise ConfigError("method.group_size", g, f"must divide the {world} workers into replicas")

    @classmethod
    def check_model(cls, cfg: DiLoCoConfig, model) -> None:
        tensors = len(list(model.parameters()))
        if cfg.fragments > tensors:
            raise ConfigError("method.fragments", cfg.fragments, f"must be <= the model's {tensors} parameter tensors")

    @classmethod
    def groups(cls, cfg: DiLoCoConfig, world: int) -> list[list[int]] | None:
        """The replicas: each allreduces every step, so each must lie in one site."""
        g = cfg.group_size
        return [list(range(i, i + g)) for i in range(0, world, g)] if g > 1 else None

    @classmethod
    def outer_step(cls, cfg: DiLoCoConfig) -> OuterStep | None:
        return OuterStep(lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.outer_nesterov,
                         fragments=cfg.fragments, mix=cfg.mix)

    def setup(self, model):
        comm, g = self.ctx.comm, self.cfg.group_size
        comm.broadcast_state(model, src=0, tag="init")
        self.group = comm.split(self.groups(self.cfg, comm.world) or []) if g > 1 else comm.alone()
        self.across = comm.split([list(range(p, comm.world, g)) for p in range(g)]) if g > 1 else comm
        self.model = self.group.data_parallel(model, tag="grad") if g > 1 else model
        params = list(model.parameters())
        self.check_model(self.cfg, model)
        seed = self.ctx.cfg.train.seed * 1000 + comm.rank
        self.fragments = [self._fragment(group, seed) for group in split_fragments(params, self.cfg.fragments)]
        self.offsets = [round((p + 1) * self.cfg.tau / self.cfg.fragments) % self.cfg.tau
                        for p in range(self.cfg.fragments)]
        self.schedule = TauSchedule(self.cfg.tau_schedule, self.cfg.tau) if self.cfg.tau_schedule else None
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        self.steps = self.outer_steps = 0
        return self.model

    def _fragment(self, params: list, seed: int) -> Fragment:
        """θ_global and the outer optimizer of one group of parameters, pseudo-gradients through `codec`."""
        c = self.cfg
        return Fragment(params, c.outer_lr, c.outer_momentum, parse_codec(c.codec, seed=seed), c.error_feedback,
                        nesterov=c.outer_nesterov)

    def lr_factor(self) -> float:
        """inner_lr_factor, moving linearly to inner_lr_factor_end over the run's steps when that is set."""
        c = self.cfg
        if c.inner_lr_factor_end == -1:
            return c.inner_lr_factor
        return ramp(c.inner_lr_factor, c.inner_lr_factor_end, 0.0, getattr(self, "steps", 0) / self.ctx.total_steps)

    def lr_scale(self) -> float:
        """A replica's update averages its g ranks' batches, as Allreduce's averages K."""
        return float(self.cfg.group_size)

    def after_step(self, step: int) -> None:
        self.steps = step + 1
        for frag in self.fragments:
            if frag.apply_at == self.steps:
                frag.merge(self.cfg.mix)
        if self.schedule:  # one fragment, tau read from the schedule at each step
            tau = self.schedule.at(self.steps / self.ctx.total_steps)
            if self.steps - self.fragments[0].sent_at >= tau:
                self._sync(self.fragments[0])
                self._end_round(self.outer_steps + 1)
            return
        for frag, offset in zip(self.fragments, self.offsets, strict=True):
            if self.steps % self.cfg.tau == offset:
                self._sync(frag)
        if self.steps % self.cfg.tau == 0:
            self._end_round(self.steps // self.cfg.tau)

    def end_epoch(self, epoch: int) -> dict:
        """The outer steps so far (rounds of every fragment), for the run's records."""
        return {"outer_steps": self.outer_steps}

    def _sync(self, frag: Fragment) -> None:
        self._outer_step(frag, self.cfg.overlap)
        if self.cfg.overlap == 0:
            frag.merge(self.cfg.mix)

    def _outer_step(self, frag: Fragment, delay: int) -> None:
        """The replicas' first ranks average and step; the others receive θ_global from theirs."""
        if self.group.rank == 0:
            frag.sync(self.across, "params", self.steps, delay)
        if self.group.world > 1:
            self.group.broadcast(frag.anchor.data, src=0, tag="params-group")
            frag.schedule(self.steps, delay)

    def _end_round(self, round_no: int) -> None:
        self.outer_steps = round_no
        self._average_buffers()
        if self.rounds.due(round_no):
            local = self.rounds.local_accuracies(self.local_model())
            self.rounds.write(round_no, self.steps, local, self.global_model(final=False))

    def _average_buffers(self) -> None:
        buffers = [b for b in self.local_model().buffers() if b.is_floating_point()]
        if buffers:
            flat = torch.cat([b.reshape(-1) for b in buffers])
            self.ctx.comm.allreduce(flat, tag="params", mean=True)
            torch.nn.utils.vector_to_parameters(flat, buffers)

    def global_model(self, final: bool):
        """θ_global. At the end, the steps since each fragment's last sync go in first with one more
        outer step, taken on the side: the training state stays as it was, so an extended run
        (--resume with more epochs) continues as if it had never ended."""
        if not final:
            return self._with_anchors()
        saved = [frag.state_dict() for frag in self.fragments]
        self._last_outer_steps()
        self._average_buffers()
        model = self._with_anchors()
        for frag, state in zip(self.fragments, saved, strict=True):
            frag.load_state_dict(state)
        return model

    def _last_outer_steps(self) -> None:
        """The final model's outer steps: each fragment with steps since its last sync syncs once more."""
        for frag in self.fragments:
            if frag.sent_at < self.steps:
                self._outer_step(frag, 0)

    def _with_anchors(self):
        return with_anchors(self.local_model(), self.fragments)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "outer_steps": self.outer_steps,
                "fragments": [f.state_dict() for f in self.fragments]}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.outer_steps = int(state.get("outer_steps", self.steps // self.cfg.tau))
        for frag, saved in zip(self.fragments, state["fragments"], strict=True):
            frag.load_state_dict(saved)
