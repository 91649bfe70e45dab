"""The outer loop of local SGD and DiLoCo for a membership that changes between outer steps.

From Douillard et al., "DiLoCo" (2023) and "Streaming DiLoCo" (2025), made elastic as torchft's
DiLoCo is: a quorum forms at every outer step, and the outer step averages the pseudo-gradients of
the quorum's members only. Algorithm, per round of a quorum of K members of whom n contribute:

  every member sends Δ = θ_global - θ_local of the round's fragment (a contributor) or zeros (a
  member that holds another θ_global, or trained nothing since it last received one);
  mean = (sum of what was sent) / n, the mean over the contributors alone;
  the members that hold the authoritative θ_global step it with the outer optimizer (DiLoCo:
  Nesterov SGD; local SGD: lr 1, no momentum, so θ_global becomes the contributors' mean);
  the receivers get θ_global and the outer optimizer's momentum from the source (tag "join").

Fragments (Streaming DiLoCo): round r synchronises fragment (r - 1) mod P, as `lowband train` does; floating buffers (BatchNorm)
are averaged every round. A contributor's Δ of fragment p covers the steps since p was last merged.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from lowband.comm.value_codecs import parse_codec
from lowband.methods.outer import Fragment, OuterStep, split_fragments, with_anchors


class ElasticOuter:
    """θ_global, the outer optimizer and the error feedback of every fragment, for one worker.

    The method's `outer_step` (methods/outer.py's OuterStep) says how θ_global steps; this class never
    asks which method it serves."""

    def __init__(self, model: nn.Module, rule: OuterStep, codec: str, error_feedback: bool, seed: int):
        params: list = list(model.parameters())
        buffers: list = [b for b in model.buffers() if b.is_floating_point()]
        groups = split_fragments(params, rule.fragments)
        if not rule.buffers_apart:  # the buffers travel in the (last) fragment's vector, through the codec
            groups[-1] = groups[-1] + buffers
        self.fragments = [Fragment(group, rule.lr, rule.momentum, parse_codec(codec, seed=seed), error_feedback,
                                   nesterov=rule.nesterov) for group in groups]
        self.buffers: Fragment | None = (Fragment(buffers, 1.0, 0.0, parse_codec("fp32"), False)
                                         if buffers and rule.buffers_apart else None)
        self.mix = rule.mix

    @classmethod
    def of(cls, model: nn.Module, method_cls, method_cfg, seed: int) -> ElasticOuter:
        """The outer state of `method_cls` (a Method class with an `outer_step`) under `method_cfg`."""
        rule = method_cls.outer_step(method_cfg)
        if rule is None:
            raise ValueError(f"{method_cfg.name} has no outer step to make elastic")
        return cls(model, rule, method_cfg.codec, method_cfg.error_feedback, seed)

    @property
    def parts(self) -> list[Fragment]:
        return self.fragments + ([self.buffers] if self.buffers else [])

    def due(self, round_no: int) -> list[Fragment]:
        """The fragments round `round_no` synchronises: round r ends inner step r·tau/P, where `lowband train`'s
        Streaming DiLoCo synchronises fragment (r - 1) mod P (methods/diloco.py's offsets)."""
        return [self.fragments[(round_no - 1) % len(self.fragments)]] + ([self.buffers] if self.buffers else [])

    def fingerprint(self) -> str:
        """16 hex digits of θ_global: members of one version compare them to know they agree."""
        digest = hashlib.blake2b(digest_size=8)
        for part in self.parts:
            digest.update(part.anchor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    @torch.no_grad()
    def average(self, comm, round_no: int, contributors: int, contribute: bool, step: bool) -> None:
        """The round's collective over the quorum `comm`: every member sends its Δ (zeros unless it
        `contribute`s); with `step`, θ_global takes one outer step with the contributors' mean."""
        self._average(comm, self.due(round_no), contributors, contribute, step)

    @torch.no_grad()
    def _average(self, comm, parts: list[Fragment], contributors: int, contribute: bool, step: bool) -> None:
        for frag in parts:
            frag.reduce_and_step(comm, "params", contributors, contribute, holds_global=step)

    @torch.no_grad()
    def final_model(self, comm, round_no: int, contributors: int, contribute: bool, model: nn.Module) -> nn.Module:
        """The job's final model after its last round `round_no`, as `lowband train`'s Streaming DiLoCo makes
        it (DiLoCo.global_model(final=True)): every other fragment has inner steps since it last synchronised,
        so it takes one more outer step over the quorum, on the side (θ_global, momentum and residuals stay
        as they were, as a checkpoint holds them for an extended job)."""
        pending = [f for f in self.fragments if f not in self.due(round_no)]
        saved = [f.state_dict() for f in pending]
        self._average(comm, pending, contributors, contribute, step=True)
        final = self.global_model(model)
        for frag, state in zip(pending, saved, strict=True):
            frag.load_state_dict(state)
        return final

    # ---- state that travels to a receiver ---------------------------------------------------------
    def state_vector(self) -> torch.Tensor:
        """θ_global and the outer momentum of every part, in one float32 vector (zeros for a momentum
        not yet made, with a flag)."""
        pieces = []
        for part in self.parts:
            momentum = part.outer.state.get(part.anchor, {}).get("momentum_buffer")
            pieces += [part.anchor.detach().float().reshape(-1),
                       torch.tensor([0.0 if momentum is None else 1.0]),
                       torch.zeros(part.numel) if momentum is None else momentum.float().reshape(-1)]
        return torch.cat(pieces)

    @torch.no_grad()
    def load_state_vector(self, vector: torch.Tensor) -> None:
        """Take a source's `state_vector`; this worker's error feedback starts over (its residual
        belonged to pseudo-gradients of another θ_global)."""
        offset = 0
        for part in self.parts:
            n = part.numel
            part.anchor.copy_(vector[offset:offset + n])
            has_momentum, momentum = vector[offset + n].item() > 0, vector[offset + n + 1:offset + 2 * n + 1]
            offset += 2 * n + 1
            part.outer.state.clear()
            if has_momentum:
                part.outer.state[part.anchor] = {"momentum_buffer": momentum.clone()}
        self.forget_feedback()

    def forget_feedback(self) -> None:
        """Drop every error-feedback residual (they belong to this worker's own past pseudo-gradients)."""
        for part in self.parts:
            if part.feedback is not None:
                part.feedback.residual = None

    def state_numel(self) -> int:
        return sum(2 * part.numel + 1 for part in self.parts)

    # ---- merging into the local model -------------------------------------------------------------
    def merge(self, parts: list[Fragment], mix: float | None = None) -> None:
        """θ_local <- mix·θ_global + (1 - mix)·θ_local for `parts` (buffers are always replaced)."""
        for part in parts:
            part.merge(1.0 if part is self.buffers else (self.mix if mix is None else mix))

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        for part, saved in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(saved)

    def global_model(self, model: nn.Module) -> nn.Module:
        """A copy of `model` holding θ_global."""
        return with_anchors(model, self.parts)
