"""The outer loop of DiLoCo-style methods: its options, its tau schedule, and one fragment's state.

`OuterConfig` holds the knobs the papers tune on the outer loop (Douillard et al. 2023; Charles et
al. 2025, "Scaling Laws for DiLoCo"; Khaled et al. 2025, "Understanding Outer Optimizers in Local
SGD"): outer lr and momentum, Nesterov or plain, a tau schedule (few inner steps while the inner
rate is high, more later: Gu et al. 2024's QSR argues for it; `TauSchedule` is its fixed-phase form),
and the inner rate relative to the synchronous one.

A fragment keeps θ_global (the "anchor") for its parameters. At a sync it sends the pseudo-gradient
Δ = θ_global - θ_local (through a codec, with error feedback when lossy), lets an outer optimizer
step θ_global with the mean Δ as its gradient, and later writes mix·θ_global + (1 - mix)·θ_local
back into the local parameters. With outer lr 1, momentum 0 and mix 1 that is exactly model
averaging (local SGD): θ_global - mean(θ_global - θ_local) = mean(θ_local).
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from lowband.comm.reduce import compressed_mean
from lowband.comm.value_codecs import Codec, ErrorFeedback
from lowband.config import MAX_LR, opt
from lowband.errors import require
from lowband.methods.base import Method
from lowband.methods.rounds import RoundsConfig

SCHEDULE_HELP = ("'' (tau fixed) or T@F/T@F/...: from fraction F of the run's steps on, tau = T (T and F "
                 "increasing, each T > method.tau, 0 < F < 1; e.g. 16@0.1 keeps tau small for the first 10%)")


class TauSchedule:
    """tau as a function of the share of the run done: `base` until the first phase, then each phase's."""

    def __init__(self, spec: str, base: int, field: str = "method.tau_schedule"):
        self.base, self.phases = base, parse_tau_schedule(spec, base, field)

    def at(self, done: float) -> int:
        """tau once `done` (0..1) of the run's steps are behind."""
        return next((t for t, f in reversed(self.phases) if done >= f), self.base)


def parse_tau_schedule(spec: str, base: int, field: str = "method.tau_schedule") -> list[tuple[int, float]]:
    """[(tau, from_fraction), ...] from 'T@F/T@F'; anything else raises ConfigError naming `field`."""
    phase = r"\s*\d+\s*@\s*(?:\d+\.?\d*|\.\d+)(?:e-?\d+)?\s*"
    shaped = isinstance(spec, str) and re.fullmatch(rf"\s*|{phase}(?:/{phase})*", spec)
    phases = [(int(t), float(f)) for t, f in (p.split("@") for p in spec.split("/"))] if shaped and spec.strip() else []
    taus, fracs = [base] + [t for t, _ in phases], [0.0] + [f for _, f in phases]
    increasing = all(a < b for a, b in itertools.pairwise(taus)) and all(a < b for a, b in itertools.pairwise(fracs))
    require(bool(shaped) and increasing and fracs[-1] < 1, field, spec, f"must be {SCHEDULE_HELP}")
    return phases


@dataclass(kw_only=True)
class OuterConfig(RoundsConfig):
    """Options of every method with an outer optimizer on averaged pseudo-gradients (DiLoCo, SparseLoCo)."""

    outer_lr: float = opt(0.7, "outer SGD learning rate (1 with outer_momentum 0 is local SGD)",
                          bounds=f"(0, {MAX_LR:g}]")
    outer_momentum: float = opt(0.9, "outer momentum in [0, 1) (0: plain SGD)", bounds="[0, 1)")
    outer_nesterov: bool = opt(True, "Nesterov's form of the outer momentum (false: heavy ball)")
    tau_schedule: str = opt("", f"a tau that grows during the run: {SCHEDULE_HELP}")
    inner_lr_factor: float = opt(1.0, "the inner rate is optim.lr times this (Charles et al. 2025 find DiLoCo's "
                                      "best inner rate about half the synchronous one)", bounds="> 0")
    inner_lr_factor_end: float = opt(-1.0, "the factor at the run's last step, > 0, reached linearly from "
                                           "inner_lr_factor over the run (-1: inner_lr_factor throughout)",
                                     bounds="(0, 100]", note=", or -1 (off)", also=(-1,))

    def __post_init__(self):
        super().__post_init__()
        parse_tau_schedule(self.tau_schedule, self.tau)


class SyncPlan:
    """When the outer loop synchronises: a pure function of the outer clock (inner steps since the run began),
    the same on every worker that holds one θ_global, so an elastic job's members agree on it.

    With a fixed tau and P fragments, fragment p synchronises once `s` steps are done when s mod tau =
    round((p + 1)·tau / P) mod tau (s > 0), and a round (buffers averaged, the round logged) ends at every
    multiple of tau. With a tau schedule (one fragment), the syncs are s_0 = 0 and s_{n+1} the first step
    s > s_n with s - s_n >= tau at s / total_steps (TauSchedule), each ending a round; past the run's
    steps (an elastic epoch that took more rounds) tau stays at the schedule's last."""

    def __init__(self, tau: int, fragments: int = 1, schedule: str = "", total_steps: int = 1):
        self.tau, self.fragments, self.total = tau, fragments, max(total_steps, 1)
        self.offsets = [round((p + 1) * tau / fragments) % tau for p in range(fragments)]
        self.schedule = TauSchedule(schedule, tau) if schedule else None
        self._syncs, self._found = [0], {0}  # the schedule's sync steps found so far, in order and as a set

    def due(self, step: int) -> list[int]:
        """The fragments that synchronise once `step` inner steps are done."""
        if step <= 0:
            return []
        if self.schedule is not None:
            return [0] if self._scheduled(step) else []
        return [p for p, offset in enumerate(self.offsets) if step % self.tau == offset]

    def ends_round(self, step: int) -> bool:
        """Whether a full round (every fragment once) ends once `step` inner steps are done."""
        if step <= 0:
            return False
        return self._scheduled(step) if self.schedule is not None else step % self.tau == 0

    def next_sync(self, step: int) -> int:
        """The first step after `step` at which something is due (a fragment, or a round's end)."""
        s = step + 1
        while not (self.due(s) or self.ends_round(s)):
            s += 1
        return s

    def _scheduled(self, step: int) -> bool:
        assert self.schedule is not None
        while self._syncs[-1] < step:
            last, s = self._syncs[-1], self._syncs[-1] + 1
            while s - last < self.schedule.at(min(s / self.total, 1.0)):
                s += 1
            self._syncs.append(s)
            self._found.add(s)
        return step in self._found

def ramp(start: float, end: float, since: float, done: float) -> float:
    """`start` until `done` (0..1 of the run) passes `since`, then linearly to `end` at 1 (-1 `end`: `start`)."""
    if end == -1 or done <= since:
        return start
    return start + (end - start) * min((done - since) / (1 - since), 1.0)


def split_fragments(params: list[nn.Parameter], parts: int) -> list[list[nn.Parameter]]:
    """`params` in order, cut into `parts` consecutive non-empty groups of about equal size."""
    total, filled = sum(p.numel() for p in params), 0
    groups: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    for i, p in enumerate(params):
        current.append(p)
        filled += p.numel()
        left_groups, left_params = parts - len(groups) - 1, len(params) - i - 1
        if left_groups and (filled >= total * (len(groups) + 1) / parts or left_params == left_groups):
            groups.append(current)
            current = []
    groups.append(current)
    return groups


def with_anchors(model: nn.Module, parts: Sequence[Fragment]) -> nn.Module:
    """A copy of `model` in which every tensor a fragment of `parts` covers holds that fragment's
    θ_global (the global model); tensors no part covers keep `model`'s values."""
    glob = copy.deepcopy(model)
    twin = {id(t): c for t, c in zip(_tensors(model), _tensors(glob), strict=True)}
    with torch.no_grad():
        for part in parts:
            vector_to_parameters(part.anchor.detach().clone(), [twin[id(t)] for t in part.params])
    return glob


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer, in an order a deep copy repeats."""
    return list(model.parameters()) + list(model.buffers())


class Fragment:
    """θ_global, the outer optimizer and the error-feedback residual of one group of parameters."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float, codec: Codec, feedback: bool,
                 nesterov: bool = True, decay: float = 1.0, by_senders: bool = False):
        """Outer SGD at `lr` with `momentum` (Nesterov's when `nesterov`); with `feedback` and a lossy
        codec, an error-feedback residual that decays by `decay` at each sync. `by_senders`: a sparse
        codec's messages are averaged over the ranks that sent each coordinate (comm/reduce.py)."""
        self.params, self.codec, self.by_senders = list(params), codec, by_senders
        self.anchor = nn.Parameter(parameters_to_vector(params).detach().clone())
        self.outer = torch.optim.SGD([self.anchor], lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)
        self.feedback = ErrorFeedback(codec, decay) if feedback and not codec.lossless else None
        self.apply_at: int | None = None  # the step at which the last sync's θ_global is merged
        self.sent_at = 0

    @property
    def numel(self) -> int:
        return self.anchor.numel()

    @torch.no_grad()
    def sync(self, comm, tag: str, step: int, delay: int) -> None:
        """Average the pseudo-gradient over `comm`'s ranks and take one outer step; merge at step + delay."""
        self.reduce_and_step(comm, tag)
        self.schedule(step, delay)

    @torch.no_grad()
    def reduce_and_step(self, comm, tag: str, contributors: int | None = None, contribute: bool = True) -> None:
        """The outer step, for a fixed membership and an elastic one alike: every rank of `comm` sends its
        pseudo-gradient Δ = θ_global - θ_local (zeros unless it `contribute`s: a member that trained nothing
        from this θ_global), the sum is divided by `contributors` (None: every rank; more than contribute:
        DiLoCo._divisor), and θ_global steps with it. Every rank of `comm` holds the same θ_global (comm/quorum.py)."""
        local = parameters_to_vector(self.params)
        delta = self.anchor.detach() - local if contribute else torch.zeros_like(local)
        mean = compressed_mean(comm, delta, self.codec, tag, self.feedback if contribute else None, self.by_senders)
        contributors = comm.world if contributors is None else contributors
        if contributors:
            self.step(mean if contributors == comm.world else mean * (comm.world / contributors))

    @torch.no_grad()
    def step(self, mean: torch.Tensor) -> None:
        """One outer step of θ_global with `mean` (the averaged pseudo-gradient) as its gradient."""
        self.anchor.grad = mean
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)

    def schedule(self, step: int, delay: int) -> None:
        """Record a sync at `step` whose θ_global is merged at step + delay."""
        self.sent_at, self.apply_at = step, step + delay

    @torch.no_grad()
    def merge(self, mix: float) -> None:
        """θ_local <- mix·θ_global + (1 - mix)·θ_local."""
        local = parameters_to_vector(self.params)
        vector_to_parameters(self.anchor.detach() * mix + local * (1 - mix), self.params)
        self.apply_at = None

    def state_dict(self) -> dict:
        """A copy (the optimizer's own state_dict shares its momentum buffers with it)."""
        return {"anchor": self.anchor.detach().clone(), "outer": copy.deepcopy(self.outer.state_dict()),
                "feedback": copy.deepcopy(self.feedback.state_dict()) if self.feedback else {},
                "apply_at": -1 if self.apply_at is None else self.apply_at, "sent_at": self.sent_at,
                "codec": copy.deepcopy(self.codec.state_dict())}

    def shared_state(self) -> dict:
        """What every holder of this θ_global holds alike: θ_global, the outer optimizer's state, the sync's
        steps (not this worker's residual or codec, which are its own)."""
        return {"anchor": self.anchor.detach().clone(), "outer": copy.deepcopy(self.outer.state_dict()),
                "apply_at": -1 if self.apply_at is None else self.apply_at, "sent_at": self.sent_at}

    def load_shared(self, state: dict) -> None:
        """Take another worker's `shared_state`; this worker's residual starts over (it belonged to
        pseudo-gradients of another θ_global)."""
        with torch.no_grad():
            self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
        self.apply_at = None if int(state["apply_at"]) < 0 else int(state["apply_at"])
        self.sent_at = int(state["sent_at"])
        if self.feedback is not None:
            self.feedback.residual = None

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
        if self.feedback:
            self.feedback.load_state_dict(state["feedback"])
        self.apply_at = None if int(state["apply_at"]) < 0 else int(state["apply_at"])
        self.sent_at = int(state["sent_at"])
        self.codec.load_state_dict(state.get("codec", {}))


class OuterMethod(Method):
    """The outer-state protocol (comm/quorum.py's OuterState) that local SGD, DiLoCo and SparseLoCo share:
    an outer clock (`steps`, inner steps since the run began, and `outer_steps`), when it syncs (`plan`, a
    SyncPlan), and the state a quorum fingerprints, hands a receiver, snapshots and restores. A subclass
    says what its shared state holds beside the clock (`_shared`) and how a receiver takes it (`_receive`);
    its `state_dict` / `load_state_dict` are what `snapshot` / `restore` keep."""

    plan: SyncPlan
    steps: int = 0
    outer_steps: int = 0

    def next_sync(self, step: int) -> int:
        return self.plan.next_sync(step)

    def steps_to_sync(self) -> int:
        return self.plan.next_sync(self.steps) - self.steps

    def shared_state(self) -> dict:
        return {"steps": self.steps, "outer_steps": self.outer_steps, **self._shared()}

    def handover(self) -> dict:
        return {}

    @torch.no_grad()
    def receive(self, shared: dict, extra: dict) -> None:
        """A source's clock and outer state; the local model starts from θ_global, this worker's residuals over."""
        self.steps, self.outer_steps = int(shared["steps"]), int(shared["outer_steps"])
        self._receive(shared, extra)

    def snapshot(self) -> tuple[dict, dict]:
        return self.state_dict(), copy.deepcopy(self.local_model().state_dict())

    def restore(self, saved: tuple[dict, dict]) -> None:
        state, model = saved
        self.load_state_dict(state)
        self.local_model().load_state_dict(model)

    def _shared(self) -> dict:
        raise NotImplementedError

    def _receive(self, shared: dict, extra: dict) -> None:
        raise NotImplementedError

