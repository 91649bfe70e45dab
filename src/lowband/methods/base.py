"""The Method protocol: a config dataclass plus hooks the trainer calls at fixed moments.

The trainer never asks which method it runs. A method changes training only through these
hooks, each of which does nothing by default:

  setup(model)            wrap or replace the model (e.g. DDP); called once before training
  loss(batch, out, loss)  add terms to the minibatch loss
  after_backward(step)    gradient communication that must finish before the optimizer step
  after_step(step)        scheduled exchanges after the optimizer step (averaging, gossip, ...)
  end_epoch(epoch)        extra figures for the epoch's metrics record
  eval_model()            the model whose test accuracy this rank reports
  state_dict()/load_state_dict()   method state that a resumed run needs
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from lowband.comm.communicator import Communicator
from lowband.config import Config, MethodConfig


@dataclass
class Context:
    """What a method may use: the whole config, the communicator, the device, a logger, the run dir."""

    cfg: Config
    comm: Communicator
    device: torch.device
    log: logging.Logger
    run_dir: str
    steps_per_epoch: int


class Method:
    Config = MethodConfig
    #: the world size this method always runs with (None: whatever --workers says)
    fixed_workers: int | None = None
    #: True: every rank starts from the same initial weights; False: each rank its own seed
    same_init: bool = True

    def __init__(self, cfg: MethodConfig, ctx: Context):
        self.cfg, self.ctx = cfg, ctx
        self.model: nn.Module | None = None

    def setup(self, model: nn.Module) -> nn.Module:
        self.model = model
        return model

    def lr_scale(self) -> float:
        """How many workers' batches one optimizer step averages (for linear lr scaling)."""
        return 1.0

    def default_warmup_epochs(self) -> float:
        return 0.0

    def loss(self, batch, outputs: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def after_backward(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def end_epoch(self, epoch: int) -> dict:
        return {}

    def eval_model(self) -> nn.Module:
        return getattr(self.model, "module", self.model)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
