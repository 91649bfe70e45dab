"""Allreduce: synchronous data parallelism (PyTorch DDP), gradients averaged every step.

The baseline every other method is compared with ("N-training" in the EDL-Dist paper). The
gradients are averaged through a DDP communication hook that counts the bytes under "grad";
the learning rate is scaled linearly with the number of workers and warmed up gradually over
the first epochs, as in Goyal et al. 2017, "Accurate, Large Minibatch SGD". Floating buffers
(BatchNorm statistics) follow rank 0 after every step, which is what DDP does by default,
but counted under "buffers". With sites (link.sites) `method.hierarchical = true` sends the
gradients through the site leaders instead of one flat ring (comm/hierarchy.py), so that only the
leaders' bytes cross the slow link.
"""

from dataclasses import dataclass

from lowband.comm.hierarchy import Hierarchy
from lowband.config import MethodConfig, opt
from lowband.methods.base import Method
from lowband.registry import METHODS


@dataclass(kw_only=True)
class AllreduceConfig(MethodConfig):
    name: str = opt("allreduce", "training method")
    warmup_epochs: float = opt(2.0, "gradual warm-up used when optim.warmup_epochs = 'auto'")
    hierarchical: bool = opt(False, "reduce inside each site, allreduce across site leaders, broadcast inside "
                                    "(only the leaders use the slow link; needs link.sites; false: the flat ring)")


@METHODS.register("allreduce")
class Allreduce(Method):
    Config = AllreduceConfig
    cfg: AllreduceConfig
    averages_workers = True
    around_the_step = True

    def setup(self, model):
        self._has_buffers = any(b.is_floating_point() for b in model.buffers())
        reducer = Hierarchy(self.ctx.comm) if self.cfg.hierarchical and self.ctx.comm.world > 1 else None
        self.model = self.ctx.comm.data_parallel(model, tag="grad", reducer=reducer)
        return self.model

    def default_warmup_epochs(self) -> float:
        return self.cfg.warmup_epochs if self.ctx.comm.world > 1 else 0.0

    def after_backward(self, step: int) -> None:
        self.ctx.comm.settle_async("grad")

    def after_step(self, step: int) -> None:
        if self._has_buffers and self.ctx.comm.world > 1:
            self.ctx.comm.broadcast_state(self.local_model(), src=0, tag="buffers", buffers_only=True)
