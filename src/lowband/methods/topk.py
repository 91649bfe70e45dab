"""TopK gossip: decentralized SGD exchanging only the k largest changes, with error feedback.

The comparison for RD-PSGD (same fraction p of coordinates per step). Following CHOCO-SGD
(Koloskova et al. 2019), every node keeps public copies x_hat of itself and of its neighbours,
which all parties update identically. Each mixing step node i sends q_i = TopK(x_i - x_hat_i)
(values plus indices, which depend on the node and must be sent: `gaps` or `bitmask`), everyone
adds the q they know of to their copies, and x_i <- x_i + gamma * sum_j W_ij (x_hat_j - x_hat_i).
What TopK leaves out stays in x_i - x_hat_i and is sent later: that is the error feedback. With
p = 1 and gamma = 1 this is D-PSGD exactly. Strong compression needs a smaller gamma (CHOCO's
theory ties it to the compression quality): at p = 0.01 gamma = 1 diverges on MNIST-1D, so the
default is min(1, 5 p). The algorithm is the TopK sparsifier (methods/sparsifiers.py); this module
holds its options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lowband.config import opt
from lowband.methods.gossip import DPSGDConfig, Gossip
from lowband.methods.sparsifiers import Sparsifier, TopK
from lowband.registry import METHODS


@dataclass(kw_only=True)
class TopKConfig(DPSGDConfig):
    name: str = opt("topk", "training method")
    p: float = opt(0.1, "fraction of coordinates sent per step", bounds="(0, 1]")
    index: Literal["gaps", "bitmask"] = opt("gaps", "index encoding (TopK indices differ per node)")
    gamma: float | str = opt("auto", "consensus step size; auto: min(1, 5 p) (gamma 1 diverges at p = 0.01)",
                             bounds="(0, 1]", also=("auto",))

    @property
    def step_size(self) -> float:
        return min(1.0, 5 * self.p) if self.gamma == "auto" else float(self.gamma)

    def sparsifier(self, seed: int) -> Sparsifier:
        """What a mixing step sends: the largest changes against the public copies."""
        return TopK(self.p, self.index, self.step_size)


@METHODS.register("topk")
class TopKGossip(Gossip):
    """TopK gossip: the Gossip method with the TopK sparsifier (public copies, error feedback)."""

    Config = TopKConfig
    cfg: TopKConfig

    @classmethod
    def world_change_refused(cls, cfg, old: int, new: int) -> str | None:
        return "keeps public copies of its neighbours' models, which belong to one ring of workers"
