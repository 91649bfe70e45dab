"""SparseLoCo: DiLoCo's rounds with top-k, 2-bit pseudo-gradients and error feedback as the momentum.

From Sarfi et al., "Communication Efficient LLM Pre-training with SparseLoCo" (2025). Every worker
runs `tau` inner steps (the paper's H, about 15). Then each worker i folds its pseudo-gradient
Δ_i = θ_global - θ_local into an error buffer, e_i <- ef_decay·e_i + Δ_i, and sends only the
round(density·chunk) largest-magnitude entries of each chunk of `chunk` consecutive coordinates:
their positions in ceil(log2 chunk) bits each, their values through `codec` (lut2 by default: 2-bit
codes into four levels per 1,024 values, the means of the values' quartiles). What it sent leaves
the buffer, e_i <- e_i - sent_i, so nothing is lost, only delayed; the decaying buffer takes the
place of DiLoCo's outer momentum. The messages are all-gathered (a sparse sum cannot be reduced on
the way: every worker receives every other's message, (K - 1) messages per worker, counted as the
ring all-gather in comm/ledger.py), each worker averages them (over the K workers, or with
`mean=senders` over the workers whose message holds each coordinate), and an outer SGD step at `outer_lr`
(1 in the paper; `outer_momentum` 0 by default, Nesterov or heavy-ball as an option) moves
θ_global; every worker continues from θ_global. The global (evaluated) model is θ_global.

Per sync a worker sends ~density·(bits of a position + bits of a value) per parameter: at the
defaults (1/64 of each 4,096-value chunk, 12 + 2 bits, plus 16 bytes of levels per 1,024 values
kept) about 0.22 bit per parameter, against 32 for fp32. Streaming fragments, replicas and the tau
schedule are DiLoCo's (methods/diloco.py).

For the end of a run (issue 40's study, benchmarks/history/JOURNAL.md): `ef_decay_end` moves the decay linearly
from `ef_decay` at the first step to `ef_decay_end` at the last (1 late in the run: the buffer stops
forgetting what it could not send while the inner rate is small); `flush` sends, once, when the final
model is made, what every error buffer still holds through a dense value codec (its bytes counted
like any sync), so the final θ_global misses nothing the workers learnt. Every epoch's record says
where the buffer's mass went (`ef`: the mean per sync of ‖Δ‖, ‖sent‖, ‖decayed‖ and ‖kept‖).
`outer_lr_end` moves the outer step the same way (from `outer_lr_from` of the run on, linearly from
`outer_lr` to `outer_lr_end` at the last step; 3 rising to 6 over the second half bought nothing on the
whole KJV, benchmarks/history/JOURNAL.md). `density_end` widens the channel late instead: from
`density_from` of the run on, the share of each chunk sent moves linearly from `density` to
`density_end` at the last step (every rank computes the same share from the step count, so the
messages keep one size per sync; the bytes are counted as sent).

In an elastic job (`lowband train --elastic`, docs/elastic.md) each worker's error buffer stays its own:
a worker that receives θ_global instead of contributing (a joiner, one that stalled) starts its buffer
over, as DiLoCo's error-feedback residual does; what a worker that leaves held in its buffer leaves with
it; a round's messages are averaged over the members that trained from its θ_global (`mean=workers`:
the others send zeros); and the flush averages the buffers of those members.

What the study found (whole KJV, GPT tiny, 4 workers, against Allreduce at its best rate): the workers'
top-k positions barely overlap (`ef.senders`, about 1.04 messages per coordinate sent of 4), so the mean
over K divides most coordinates by K and an `outer_lr` near K (3) undoes it; `mean=senders` is the
K-free form. Scaling it on with K does not carry: at 16 workers outer lr 12 blew up, since a coordinate
every worker sends then moves 12 times its value; `mean=senders` at outer lr 1 ended with outer lr 3's
mean on the held-out seeds (+6.1% from Allreduce against +6.6%), steadier but behind it on two of three.
At outer lr 3 the inner rate's best rises with it (0.016 against 0.008 at outer lr 1). An inner rate whose
factor rises over the run (DiLoCo's `inner_lr_factor_end`, 0.5 to 1 or 1 to 2), 4-bit values at 63 of each
4,096, and tau 16 at twice the density all ended further behind. The default stays the paper's outer lr 1;
the suites name their setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from lowband.comm.quorum import Round
from lowband.comm.reduce import compressed_mean
from lowband.comm.value_codecs import DENSE, VALUE_SPECS, Codec, TopKCodec, parse_codec
from lowband.config import MAX_LR, Form, opt
from lowband.errors import ConfigError, require
from lowband.methods.diloco import DiLoCo, DiLoCoConfig
from lowband.methods.outer import Fragment, ramp
from lowband.registry import METHODS


@dataclass(kw_only=True)
class SparseLoCoConfig(DiLoCoConfig):
    name: str = opt("sparseloco", "training method")
    tau: int = opt(15, "inner steps between outer steps (H in the paper)")
    density: float = opt(1 / 64, "the share of each chunk's coordinates sent, in (0, 1] (the paper: 64 of 4,096)",
                         bounds="(0, 1]")
    chunk: int = opt(4096, "coordinates per top-k chunk (positions take ceil(log2 chunk) bits)", bounds=">= 1")
    ef_decay: float = opt(0.95, "error-buffer decay in [0, 1]: e <- ef_decay·e + Δ before each top-k", bounds="[0, 1]")
    codec: str = opt("lut2", "how the kept values travel",
                     form=Form(f"a dense codec: {VALUE_SPECS}", DENSE, note=" (the top-k is method.density)"))
    outer_lr: float = opt(1.0, "outer SGD learning rate on the averaged sparse pseudo-gradients")
    outer_momentum: float = opt(0.0, "outer momentum in [0, 1) (0: the error buffer is the momentum)")
    mean: Literal["workers", "senders"] = opt(
        "workers", "how the messages are averaged: 'workers' divides each coordinate's sum by the K workers (the "
                   "paper), 'senders' by the workers whose message holds it")
    ef_decay_end: float = opt(-1.0, "the decay at the run's last step, reached linearly from ef_decay, in [0, 1] "
                                    "(-1: ef_decay throughout)",
                              bounds="[0, 1]", note=", or -1 for ef_decay throughout", also=(-1,))
    flush: str = opt("", "at the end, send what the error buffers hold once through this dense codec (its bytes "
                         "counted)", form=Form(f"'' (no flush) or a dense codec: {VALUE_SPECS}", rf"\s*|{DENSE}"))
    density_end: float = opt(-1.0, "the density at the run's last step, in (0, 1], reached linearly from density "
                                   "from density_from of the run on (-1: density throughout)",
                             bounds="(0, 1]", note=", or -1 for density throughout", also=(-1,))
    density_from: float = opt(0.0, "the share of the run's steps, in [0, 1), after which the density moves "
                                   "towards density_end", bounds="[0, 1)")
    outer_lr_end: float = opt(-1.0, "the outer lr at the run's last step, > 0, reached linearly from outer_lr from "
                                    "outer_lr_from of the run on (-1: outer_lr throughout)",
                              bounds=f"(0, {MAX_LR:g}]", note=", or -1 for outer_lr throughout", also=(-1,))
    outer_lr_from: float = opt(0.0, "the share of the run's steps, in [0, 1), after which the outer lr moves "
                                    "towards outer_lr_end", bounds="[0, 1)")

    def __post_init__(self):
        super().__post_init__()
        for field, share in (("method.density", self.density), ("method.density_end", self.density_end)):
            require(share == -1 or round(share * self.chunk) >= 1, field, share,
                    f"keeps round({share:g} x method.chunk={self.chunk}) = 0 of each chunk's values, so nothing would "
                    f"be sent; the smallest is 1/{self.chunk} = {1 / self.chunk:.3g}")
        require(self.error_feedback, "method.error_feedback", self.error_feedback,
                "must be true: SparseLoCo's error buffer is the method (use diloco with codec=topk:F to go without)")


def sparse_codec(cfg: SparseLoCoConfig, seed: int = 0) -> Codec:
    """The message codec: per chunk, the top round(density·chunk) positions and their coded values."""
    return TopKCodec(cfg.density, parse_codec(cfg.codec, "method.codec", seed), chunk=cfg.chunk)


@METHODS.register("sparseloco")
class SparseLoCo(DiLoCo):
    Config = SparseLoCoConfig
    cfg: SparseLoCoConfig

    @classmethod
    def check_model(cls, cfg: DiLoCoConfig, model) -> None:
        assert isinstance(cfg, SparseLoCoConfig)
        super().check_model(cfg, model)
        size = sum(p.numel() for p in model.parameters())
        if cfg.chunk > size:
            raise ConfigError("method.chunk", cfg.chunk, f"must be <= the model's {size:,} parameters")

    @classmethod
    def check_elastic(cls, cfg: DiLoCoConfig) -> None:
        """DiLoCo's rule, and the mean over the workers: a member that trained nothing from θ_global sends
        a message of zeros in a round, and `mean=senders` would count it among a coordinate's senders."""
        assert isinstance(cfg, SparseLoCoConfig)
        super().check_elastic(cfg)
        if cfg.mean != "workers":
            raise ConfigError("method.mean", cfg.mean, "must be 'workers' with --elastic: a member that trained "
                                                       "nothing from θ_global sends a message of zeros")

    def _fragment(self, params: list, seed: int) -> Fragment:
        c = self.cfg
        return Fragment(params, c.outer_lr, c.outer_momentum, sparse_codec(c, seed), True,
                        nesterov=c.outer_nesterov, decay=c.ef_decay, by_senders=c.mean == "senders")

    def decay_at(self, done: float) -> float:
        """The error buffer's decay once `done` (0..1) of the run's steps are behind."""
        c = self.cfg
        return c.ef_decay if c.ef_decay_end == -1 else c.ef_decay + (c.ef_decay_end - c.ef_decay) * min(done, 1.0)

    def density_at(self, done: float) -> float:
        """The share of each chunk sent once `done` (0..1) of the run's steps are behind: `density`, then
        from `density_from` on linearly to `density_end` at the last step."""
        c = self.cfg
        return ramp(c.density, c.density_end, c.density_from, done)

    def outer_lr_at(self, done: float) -> float:
        """The outer lr once `done` (0..1) of the run's steps are behind (`outer_lr`, then the ramp)."""
        c = self.cfg
        return ramp(c.outer_lr, c.outer_lr_end, c.outer_lr_from, done)

    def _outer_step(self, frag: Fragment, rnd: Round, delay: int) -> None:
        done = self.steps / max(self.ctx.total_steps, 1)
        if frag.feedback:
            frag.feedback.decay = self.decay_at(done)
        if self.cfg.density_end != -1 and isinstance(frag.codec, TopKCodec):
            frag.codec.set_fraction(self.density_at(done))
        if self.cfg.outer_lr_end != -1:
            frag.outer.param_groups[0]["lr"] = self.outer_lr_at(done)
        super()._outer_step(frag, rnd, delay)

    def end_epoch(self, epoch: int) -> dict:
        """DiLoCo's figures and where the error buffers' mass went this epoch (this rank's, summed over
        fragments): mean per sync of ‖Δ‖ (the pseudo-gradient), ‖sent‖, ‖decayed‖ and ‖kept‖; and the
        workers' overlap, `senders` (averaged over fragments): how many messages held each coordinate sent."""
        flows = [f.feedback.take_flow() for f in self.fragments if f.feedback]
        flows = [f for f in flows if f]
        extra = super().end_epoch(epoch)
        if flows:
            extra["ef"] = {k: sum(f[k] for f in flows) / (len(flows) if k == "senders" else 1) for k in flows[0]}
        return extra

    def _flushes(self) -> bool:
        return bool(self.cfg.flush.strip())

    def _last_exchange(self, rnd: Round, pending: list[int]) -> None:
        """DiLoCo's last outer steps, then the flush: every fragment's residual, sent once through the
        dense codec `flush` (no error feedback: nothing is left), averaged, one more outer step."""
        super()._last_exchange(rnd, pending)
        if not self._flushes():
            return
        codec = parse_codec(self.cfg.flush, "method.flush", seed=self.ctx.cfg.train.seed * 1000 + self.ctx.rank)
        for frag in self.fragments:
            if self.group.rank == 0:
                flush(frag, rnd, codec, self._divisor(rnd))
            if self.group.world > 1:
                self.group.broadcast(frag.anchor.data, src=0, tag="params-group")


@torch.no_grad()
def flush(frag: Fragment, rnd: Round, codec: Codec, divisor: int | None = None) -> None:
    """One outer step of `frag` on the mean of the round's error buffers, each sent once through the dense
    `codec`, and the buffer emptied. The mean is over the members that hold one, the round's contributors
    (or `divisor`, DiLoCo._divisor): a member that received θ_global instead (an elastic job's joiner or
    stalled worker) sends zeros."""
    assert frag.feedback is not None
    held = frag.feedback.residual
    held = torch.zeros(frag.numel) if held is None or not rnd.contributes else held
    mean = compressed_mean(rnd.comm, held.to(frag.anchor.device), codec, "params")
    divisor = rnd.contributors if divisor is None else divisor
    if divisor:
        frag.step(mean * (rnd.comm.world / divisor))
    frag.feedback.residual = torch.zeros_like(held)
