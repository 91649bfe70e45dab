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
the mean change; scaling both diverged on MNIST-1D, benchmarks/history/JOURNAL.md).

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

from lowband.comm.quorum import Round
from lowband.comm.value_codecs import SPEC_HELP, parse_codec
from lowband.config import Form, opt
from lowband.errors import ConfigError, require
from lowband.methods.outer import Fragment, OuterConfig, OuterMethod, SyncPlan, ramp, split_fragments, with_anchors
from lowband.methods.rounds import RoundLog
from lowband.registry import METHODS


@dataclass(kw_only=True)
class DiLoCoConfig(OuterConfig):
    name: str = opt("diloco", "training method")
    tau: int = opt(16, "inner steps between outer steps (H in the paper)")
    fragments: int = opt(1, "Streaming DiLoCo: parameter fragments synchronised in rotation (1: all at once)")
    overlap: int = opt(0, "steps between sending a fragment and merging its result; < tau / fragments")
    mix: float = opt(1.0, "merge weight of θ_global: θ_local <- mix·θ_global + (1 - mix)·θ_local, in (0, 1]", bounds="(0, 1]")
    codec: str = opt("fp32", "how pseudo-gradients travel", form=Form(SPEC_HELP, parse=parse_codec))
    error_feedback: bool = opt(True, "keep what a lossy codec dropped and send it with the next sync")
    group_size: int = opt(1, "ranks per replica, allreducing gradients every step; outer steps average the replicas",
                          bounds=">= 1")

    def __post_init__(self):
        super().__post_init__()
        require(1 <= self.fragments <= self.tau, "method.fragments", self.fragments,
                f"must be in [1, method.tau={self.tau}]")
        require(self.overlap >= 0 and (self.overlap == 0 or self.overlap < self.tau / self.fragments),
                "method.overlap", self.overlap, f"must be >= 0 and < tau / fragments = {self.tau / self.fragments:g}")
        require(not self.tau_schedule or self.fragments == 1, "method.tau_schedule", self.tau_schedule,
                f"needs method.fragments=1 (streaming fragments keep a fixed tau); fragments={self.fragments}")


@METHODS.register("diloco")
class DiLoCo(OuterMethod):
    Config = DiLoCoConfig
    cfg: DiLoCoConfig
    around_the_step = True

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
    def check_elastic(cls, cfg: DiLoCoConfig) -> None:
        if cfg.group_size > 1:
            raise ConfigError("method.group_size", cfg.group_size, "must be 1 with --elastic: an elastic worker is one "
                                                                   "process, not a replica of several")

    def setup(self, model):
        comm, g = self.ctx.comm, self.cfg.group_size
        comm.broadcast_state(model, src=0, tag="init")
        self.group = comm.split(self.groups(self.cfg, comm.world) or []) if g > 1 else comm.alone()
        self.across = comm.split([list(range(p, comm.world, g)) for p in range(g)]) if g > 1 else comm
        self.quorum = self.ctx.quorum(self.across)  # who takes the outer step: a fixed world, or an elastic job's
        self.model = self.group.data_parallel(model, tag="grad") if g > 1 else model
        params = list(model.parameters())
        self.check_model(self.cfg, model)
        seed = self.ctx.cfg.train.seed * 1000 + self.ctx.rank
        self.fragments = [self._fragment(group, seed) for group in split_fragments(params, self.cfg.fragments)]
        self.plan = SyncPlan(self.cfg.tau, self.cfg.fragments, self.cfg.tau_schedule, self.ctx.total_steps)
        self.rounds = RoundLog(self.ctx, self.cfg.tau, self.cfg.round_evals)
        self.steps = self.outer_steps = 0  # the outer clock (inner steps since the run began) and full rounds
        return self.model

    def _fragment(self, params: list, seed: int) -> Fragment:
        """θ_global and the outer optimizer of one group of parameters, pseudo-gradients through `codec`."""
        c = self.cfg
        return Fragment(params, c.outer_lr, c.outer_momentum, parse_codec(c.codec, seed=seed), c.error_feedback,
                        nesterov=c.outer_nesterov)

    def lr_factor(self, done: float) -> float:
        """inner_lr_factor, moving linearly to inner_lr_factor_end over the run when that is set; `done` is
        the share of the run's epochs trained (a pure function of the place, as nanoGPT's get_lr(it))."""
        c = self.cfg
        return c.inner_lr_factor if c.inner_lr_factor_end == -1 else ramp(c.inner_lr_factor, c.inner_lr_factor_end,
                                                                           0.0, done)

    def divergence_suspects(self) -> str:
        c = self.cfg
        return f"method.outer_lr ({c.outer_lr:g})" + (f" or method.outer_momentum ({c.outer_momentum:g})"
                                                      if c.outer_momentum else "")

    def lr_scale(self) -> float:
        """A replica's update averages its g ranks' batches, as Allreduce's averages K."""
        return float(self.cfg.group_size)

    def after_step(self, step: int) -> None:
        self.steps += 1  # the outer clock: a receiver in an elastic job takes the source's
        for frag in self.fragments:
            if frag.apply_at == self.steps:
                frag.merge(self.cfg.mix)
        due, ends = self.plan.due(self.steps), self.plan.ends_round(self.steps)
        if due or ends:
            self.quorum.outer_step(lambda rnd: self._exchange(rnd, due, ends), self)

    def end_epoch(self, epoch: int) -> dict:
        """The outer steps so far (rounds of every fragment), for the run's records."""
        return {"outer_steps": self.outer_steps}

    def _exchange(self, rnd: Round, due: list[int], ends: bool) -> None:
        """One outer step's collectives over the round: the due fragments, then at a full round's end the
        floating buffers and the round's own figures."""
        for p in due:
            self._sync(self.fragments[p], rnd)
        if ends:
            self.outer_steps += 1
            self._average_buffers(rnd)
            if self.rounds.due(self.outer_steps):
                everyone = self._everyone(rnd)
                local = self.rounds.local_accuracies(self.local_model(), everyone)
                self.rounds.write(self.outer_steps, self.steps, local, self.global_model(final=False), everyone)

    def _everyone(self, rnd: Round):
        """Every rank of the round: the round's members, or with replicas (a fixed world) every rank."""
        return self.ctx.comm if self.cfg.group_size > 1 else rnd.comm

    def _sync(self, frag: Fragment, rnd: Round) -> None:
        self._outer_step(frag, rnd, self.cfg.overlap)
        if self.cfg.overlap == 0:
            frag.merge(self.cfg.mix)

    def _outer_step(self, frag: Fragment, rnd: Round, delay: int) -> None:
        """The replicas' first ranks average and step; the others receive θ_global from theirs."""
        if self.group.rank == 0:
            frag.reduce_and_step(rnd.comm, "params", self._divisor(rnd), rnd.contributes)
        if self.group.world > 1:
            self.group.broadcast(frag.anchor.data, src=0, tag="params-group")
        frag.schedule(self.steps, delay)

    def _divisor(self, rnd: Round) -> int:
        """What the round's sum of pseudo-gradients is divided by: its contributors; in an elastic job with
        elastic.scale_with_quorum, at least the replicas launched, so an absent one counts as a zero
        pseudo-gradient and a smaller quorum takes a smaller outer step (Charles et al. 2025: the best outer
        rate grows with the replicas; one worker at the rate three train well with stalls at chance,
        benchmarks/quorum_rates.py). A fixed world's rounds hold every replica: the mean either way."""
        elastic = self.ctx.cfg.elastic
        if rnd.contributors and elastic.on and elastic.scale_with_quorum:
            return max(rnd.contributors, self.ctx.cfg.train.workers)
        return rnd.contributors

    def _average_buffers(self, rnd: Round) -> None:
        """Floating buffers (BatchNorm) averaged over the round's contributors, in fp32."""
        buffers = [b for b in self.local_model().buffers() if b.is_floating_point()]
        if not buffers or not rnd.contributors:
            return
        everyone, flat = self._everyone(rnd), torch.cat([b.reshape(-1) for b in buffers])
        if rnd.contributors == everyone.world:
            everyone.allreduce(flat, tag="params", mean=True)
        else:
            flat = flat if rnd.contributes else torch.zeros_like(flat)
            flat = everyone.allreduce(flat, tag="params") / rnd.contributors
        torch.nn.utils.vector_to_parameters(flat, buffers)

    def global_model(self, final: bool):
        """θ_global. At the end, the steps since each fragment's last sync go in first with one more
        outer step, taken on the side: the training state stays as it was, so an extended run
        (--resume with more epochs) continues as if it had never ended."""
        if not final:
            return self._with_anchors()
        saved = [frag.state_dict() for frag in self.fragments]
        pending = [p for p, frag in enumerate(self.fragments) if frag.sent_at < self.steps]
        if pending or self._has_buffers() or self._flushes():
            self.quorum.outer_step(lambda rnd: self._last_exchange(rnd, pending), self)
        model = self._with_anchors()
        for frag, state in zip(self.fragments, saved, strict=True):
            frag.load_state_dict(state)
        return model

    def _last_exchange(self, rnd: Round, pending: list[int]) -> None:
        """The final model's outer steps: each fragment with steps since its last sync syncs once more;
        the buffers averaged."""
        for p in pending:
            self._outer_step(self.fragments[p], rnd, 0)
        self._average_buffers(rnd)

    def _has_buffers(self) -> bool:
        return any(b.is_floating_point() for b in self.local_model().buffers())

    def _flushes(self) -> bool:
        """Whether the final model sends something besides the pending fragments (SparseLoCo's flush)."""
        return False

    def _with_anchors(self):
        return with_anchors(self.local_model(), self.fragments)

    # ---- the outer state a quorum handles (comm/quorum.py's OuterState) ----------------------------
    def _shared(self) -> dict:
        return {"fragments": [f.shared_state() for f in self.fragments]}

    def handover(self) -> dict:
        return {"buffers": [b.detach().clone() for b in self.local_model().buffers() if b.is_floating_point()]}

    def _receive(self, shared: dict, extra: dict) -> None:
        """θ_global and the outer optimizer of each fragment; the local model starts from θ_global (and the
        source's buffers)."""
        for frag, state in zip(self.fragments, shared["fragments"], strict=True):
            frag.load_shared(state)
            frag.merge(1.0)
            frag.apply_at = None if int(state["apply_at"]) < 0 else int(state["apply_at"])
        buffers = [b for b in self.local_model().buffers() if b.is_floating_point()]
        for mine, theirs in zip(buffers, extra.get("buffers", []), strict=False):
            mine.copy_(theirs)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "outer_steps": self.outer_steps,
                "fragments": [f.state_dict() for f in self.fragments]}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.outer_steps = int(state.get("outer_steps", self.steps // self.cfg.tau))
        for frag, saved in zip(self.fragments, state["fragments"], strict=True):
            frag.load_state_dict(saved)
