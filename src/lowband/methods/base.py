"""The Method protocol: a config dataclass plus hooks the trainer calls at fixed moments.

The trainer never asks which method it runs. A method changes training only through these
hooks, each of which does nothing by default:

  setup(model)            wrap or replace the model (e.g. DDP); called once before training
  batches(epoch, source)  the epoch's `data.Batch`es; default source.epoch(epoch)
  loss(batch, out, loss)  add terms to the minibatch loss
  after_backward(step)    gradient communication that must finish before the optimizer step
  after_step(step)        scheduled exchanges after the optimizer step (averaging, gossip, ...)
  end_epoch(epoch)        extra figures for the epoch's metrics record
  local_model()           this rank's model (its test accuracy is reported per rank)
  global_model(final)     the method's global model now (averaged, ensemble), or None; called on
                          every rank (it may communicate), evaluated on rank 0
  state_dict()/load_state_dict()   method state that a resumed run needs
  end_training()          after the last step of a run that finished (not after a failure): let
                          peers finish with what they still use (codistillation's prediction servers)
  close()                 release what the method holds (threads, connections); always called
  services(cfg)           (classmethod) processes to run beside the workers, in the launcher
  check_elastic(cfg)      (classmethod) refuse what `lowband train --elastic` cannot run (ConfigError); a
                          method with an outer loop takes its outer steps through `ctx.quorum`, the
                          same hooks for a fixed world and an elastic job (comm/quorum.py)
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from lowband.comm.communicator import Communicator
from lowband.comm.quorum import FixedQuorum, Quorum
from lowband.config import Config, MethodConfig
from lowband.data import TensorData
from lowband.errors import ConfigError
from lowband.run.rundir import RunDir


@dataclass
class Context:
    """What a method may use: config, communicator, device, logger, run directory, data, evaluation.

    A method writes files only through `run` (`run.stream("rounds")`, `run.file("exchange")`), so
    that a resumed run cuts its records back and nothing else needs to know the file names.
    """

    cfg: Config
    comm: Communicator
    device: torch.device
    log: logging.Logger
    run: RunDir  # a path is accepted too, and made a RunDir
    steps_per_epoch: int
    data: TensorData | None = None
    shard: torch.Tensor | None = None
    #: validation accuracy of a model; timed as evaluation, not as training compute
    evaluate: Callable[[nn.Module], float] = lambda model: float("nan")
    #: who takes an outer step over a communicator: every rank of it (a fixed world), or an elastic job's
    #: quorum met at each outer step
    quorum: Callable[[Communicator], Quorum] = FixedQuorum
    #: the workers the data plan is cut for (0: the communicator's world)
    width: int = 0

    def __post_init__(self):
        if not isinstance(self.run, RunDir):
            self.run = RunDir(self.run, self.comm.rank)
        self.width = self.width or self.comm.world

    @property
    def rank(self) -> int:
        """This worker's number in the run: its global rank, or an elastic worker's id."""
        return self.comm.global_ranks[self.comm.rank]

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.cfg.train.epochs


class Method:
    Config = MethodConfig
    #: the world size this method always runs with (None: whatever --workers says)
    fixed_workers: int | None = None
    #: True: every rank starts from the same initial weights; False: each rank its own seed
    same_init: bool = True
    #: the fewest workers the method makes sense with
    min_workers: int = 1
    #: True: the ranks train separate models that meet only through shared storage, so a dead
    #: rank does not stop the others and no collective spans all ranks (metrics per rank)
    independent_models: bool = False
    #: True: the model follows the mean of all K workers' updates (allreduce, model averaging,
    #: gossip), so by default its learning rate scales linearly with K after a 2-epoch warm-up, like
    #: the synchronous baseline it approximates (Goyal et al. 2017; Lin et al. 2020 for local SGD)
    averages_workers: bool = False
    #: True: the method's work happens around the optimizer step (setup, after_backward, after_step) and needs
    #: nothing else of lowband's trainer (its data, services beside the workers), so `lowband.wrap` runs it in a
    #: user's own loop; the others shape the loss or need those services, and wrap refuses them
    around_the_step: bool = False

    @classmethod
    def check(cls, cfg: Any, world: int) -> None:
        """Reject options that cannot work with `world` workers (raise ConfigError); before any worker starts."""

    @classmethod
    def check_model(cls, cfg: Any, model: nn.Module) -> None:
        """Reject options that cannot work with this model (raise ConfigError); the launcher builds the
        model once before any worker starts and asks."""

    #: why this method cannot train a language model (lowband.data.metric.task_of == "lm"); None: it can
    language_model_refused: str | None = None

    @classmethod
    def groups(cls, cfg: Any, world: int) -> list[list[int]] | None:
        """The groups of ranks that train one model together (each must lie in one site); None: no groups."""
        return None

    @classmethod
    def world_change_refused(cls, cfg: Any, old: int, new: int) -> str | None:
        """Why a run cannot resume with `new` workers after checkpointing with `old` (None: it can,
        each new rank r taking old rank r % old's state; see lowband.run.reshard)."""
        if cls.fixed_workers:
            return f"runs {cls.fixed_workers} process(es) always"
        if cls.independent_models or not cls.same_init:
            return "trains a different model on each worker, so another world size would drop or copy models"
        if cls.groups(cfg, old) is not None or cls.groups(cfg, new) is not None:
            return "its groups of workers are fixed for the run"
        return None

    @classmethod
    def partition(cls, cfg: Any, labels: torch.Tensor, world: int, seed: int) -> list[torch.Tensor] | None:
        """Each rank's training indices, when the method decides them (None: data.partition decides)."""
        return None

    @classmethod
    def check_elastic(cls, cfg: Any) -> None:
        """Refuse (ConfigError naming the field) what an elastic job cannot run; a method whose outer steps go
        through `ctx.quorum` runs there (comm/quorum.py) and refuses only the options it cannot honour."""
        raise ConfigError("method.name", cfg.name, "--elastic trains methods whose workers meet only at outer "
                                                   "steps (local_sgd, diloco, sparseloco)")

    @classmethod
    def services(cls, cfg: Any):
        """A context manager for processes the run needs beside its workers (EDL-Dist: Redis, teachers);
        entered by the launcher around the workers, restarts included."""
        return contextlib.nullcontext()

    def __init__(self, cfg: MethodConfig, ctx: Context):
        self.cfg, self.ctx = cfg, ctx
        self.model: nn.Module = nn.Identity()  # replaced in setup()

    def setup(self, model: nn.Module) -> nn.Module:
        self.model = model
        return model

    def batches(self, epoch: int, source):
        """The epoch's minibatches; a method may add to each (EDL-Dist adds the teacher's logits)."""
        return source.epoch(epoch)

    def end_training(self) -> None:
        pass

    def close(self) -> None:
        pass

    def lr_scale(self) -> float:
        """How many workers' batches the model's updates average (for linear lr scaling)."""
        return float(self.ctx.width) if self.averages_workers else 1.0

    def lr_factor(self, done: float) -> float:
        """A factor on the scheduled learning rate once `done` (0..1) of the run's epochs are trained,
        whatever optim.lr_scaling says (DiLoCo's inner-rate rule relative to the synchronous one); 1 by
        default. A pure function of the place, so every worker of any membership agrees on it."""
        return 1.0

    def divergence_suspects(self) -> str:
        """The method's own settings that could make training diverge, named in the one line a divergence
        prints beside optim.lr ('' : none)."""
        return ""

    def default_warmup_epochs(self) -> float:
        """Warm-up used when optim.warmup_epochs = 'auto': 2 epochs when the rate is scaled up."""
        return 2.0 if self.lr_scale() > 1 else 0.0

    def loss(self, batch, outputs: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def after_backward(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def end_epoch(self, epoch: int) -> dict:
        return {}

    def local_model(self) -> nn.Module:
        return getattr(self.model, "module", self.model)

    def global_model(self, final: bool) -> nn.Module | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
