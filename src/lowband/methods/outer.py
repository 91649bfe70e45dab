"""The outer loop of DiLoCo for one fragment of a model's parameters.

A fragment keeps θ_global (the "anchor") for its parameters. At a sync it sends the pseudo-gradient
Δ = θ_global - θ_local (through a codec, with error feedback when lossy), lets an outer optimizer
step θ_global with the mean Δ as its gradient, and later writes mix·θ_global + (1 - mix)·θ_local
back into the local parameters. With outer lr 1, momentum 0 and mix 1 that is exactly model
averaging (local SGD): θ_global - mean(θ_global - θ_local) = mean(θ_local).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from lowband.comm.reduce import compressed_mean
from lowband.comm.value_codecs import Codec, ErrorFeedback


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


class Fragment:
    """θ_global, the outer optimizer and the error-feedback residual of one group of parameters."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float, codec: Codec, feedback: bool):
        self.params, self.codec = list(params), codec
        self.anchor = nn.Parameter(parameters_to_vector(params).detach().clone())
        self.outer = torch.optim.SGD([self.anchor], lr=lr, momentum=momentum, nesterov=momentum > 0)
        self.feedback = ErrorFeedback(codec) if feedback and not codec.lossless else None
        self.apply_at: int | None = None  # the step at which the last sync's θ_global is merged
        self.sent_at = 0

    @property
    def numel(self) -> int:
        return self.anchor.numel()

    @torch.no_grad()
    def sync(self, comm, tag: str, step: int, delay: int) -> None:
        """Average the pseudo-gradient over `comm`'s ranks and take one outer step; merge at step + delay."""
        delta = self.anchor.detach() - parameters_to_vector(self.params)
        self.anchor.grad = compressed_mean(comm, delta, self.codec, tag, self.feedback)
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        self.schedule(step, delay)

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

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.anchor.copy_(state["anchor"])
        self.outer.load_state_dict(state["outer"])
        if self.feedback:
            self.feedback.load_state_dict(state["feedback"])
        self.apply_at = None if int(state["apply_at"]) < 0 else int(state["apply_at"])
        self.sent_at = int(state["sent_at"])
        self.codec.load_state_dict(state.get("codec", {}))
