"""AFSD: codistillation in feature space (papers/afsd-feature-space-distillation.txt).

Everything is as in codistillation (stale peer checkpoints exchanged through shared storage
every N steps) except the distillation term: for a batch of n samples each model compares the
n x n matrix of pairwise distances between its penultimate features (the input of its final
linear layer) with each peer's, alpha * 1/(m-1) * sum_j (1/n) sum_kl |E[k,l] - E_j[k,l]|
(distill/losses.py: afsd_loss; `n2` divides by n^2 instead). Distances are rotation-invariant, so
models need not agree on a feature basis. The output-distillation loss is measured alongside,
not trained on, as in the paper's Fig. 4 ("output_distill_loss" in the metrics). With
`exchange = "server"` the peers' servers answer their features (not their logits), so that figure
is measured with the store only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from lowband.config import opt
from lowband.distill.losses import afsd_loss, codistill_loss
from lowband.errors import ConfigError
from lowband.methods.codistill import Codistill, CodistillConfig, TappedModel
from lowband.models import features_of
from lowband.registry import METHODS


@dataclass(kw_only=True)
class AFSDConfig(CodistillConfig):
    name: str = opt("afsd", "training method")
    alpha: float = opt(0.001, "weight of the feature-distance term (with normalize=n it grows with the batch size)")
    distance: Literal["euclidean", "sqeuclidean", "cosine"] = opt("euclidean", "D between two feature vectors")
    normalize: Literal["n", "n2"] = opt("n", "divide the summed distance differences by n (the paper) or n^2")


@METHODS.register("afsd")
class AFSD(Codistill):
    Config = AFSDConfig
    cfg: AFSDConfig
    answers_features = True

    @classmethod
    def check(cls, cfg, world: int) -> None:
        if cfg.answer_topk:
            raise ConfigError("method.answer_topk", cfg.answer_topk, "must be 0 for afsd: its servers answer "
                                                                    "features, and top-k applies to logits")
        super().check(cfg, world)

    def wrap(self, model):
        return TappedModel(features_of(model))

    def distill_term(self, x, outputs):
        if self.peers is not None:
            peer_features = self.peers.ask(x, self.exchanged if self.cfg.wait_s > 0 else 0)
            if not peer_features:
                return None
            return afsd_loss(self.net.features, peer_features, self.cfg.distance, self.cfg.normalize)
        with torch.no_grad():
            peer_features = [t.features(x) for t in self.teachers.values()]
            measured = codistill_loss(outputs, [t.head(f) for t, f in zip(self.teachers.values(), peer_features, strict=True)])
        self._add("output_distill_loss", measured.item())
        return afsd_loss(self.net.features, peer_features, self.cfg.distance, self.cfg.normalize)
