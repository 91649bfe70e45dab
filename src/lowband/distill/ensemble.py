"""An output ensemble of models as one module (EC-DNN, E-DNN, churn)."""

from __future__ import annotations

import torch
from torch import nn


class Ensemble(nn.Module):
    """G(x) = sum_k w_k softmax(f_k(x)); forward returns log G(x), so argmax and NLL work on it."""

    def __init__(self, members: list[nn.Module], weights: torch.Tensor | None = None):
        super().__init__()
        self.members = nn.ModuleList(members)
        k, device = len(members), next(members[0].parameters()).device  # the weights live with the members
        self.weights: torch.Tensor
        self.register_buffer("weights", torch.full((k,), 1.0 / k, device=device) if weights is None
                             else weights.detach().clone().float().to(device))

    @torch.no_grad()
    def member_probs(self, x: torch.Tensor) -> torch.Tensor:
        """(K, N, C) softmax outputs of every member on x."""
        return torch.stack([torch.softmax(m(x), dim=-1) for m in self.members])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([torch.softmax(m(x), dim=-1) for m in self.members])
        mixed = (self.weights.view(-1, *[1] * (probs.dim() - 1)) * probs).sum(0)
        return mixed.clamp_min(1e-12).log()  # regression weights may be negative: clamp before the log
