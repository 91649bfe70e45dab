"""lowband's methods inside Lightning's `Trainer`, as a Callback (`pip install lowband[lightning]`).

    from lowband.integrations.lightning import LowbandCallback
    from lowband.integrations.world import take_world  # torchrun's variables out of the environment

    world = take_world()                             # first, before lightning.Trainer
    sync = LowbandCallback("diloco:tau=16", world)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=n, callbacks=[sync])
    trainer.fit(module, my_shard(world.rank, world.size))   # at the end `module` holds the final model
    sync.bytes_sent

Under torchrun Lightning would run its DDP strategy and average the gradients at every step; with torchrun's
variables taken out first each Trainer trains its process alone (devices=1), and the callback joins the
workers for the method's exchanges only, as the Hugging Face callback does (lowband.integrations.hf).

Lightning steps the optimizer with a closure that runs the forward and backward passes, so the optimizer's
pre-step hook would run before the gradients exist: this callback wraps without it and runs the method's
gradient exchange (Allreduce's average) in `on_before_optimizer_step`, after the backward pass and before
the update. The method's outer steps run after every optimizer step (`on_train_batch_end`; use
accumulate_grad_batches=1). At the end the method's final model is loaded into the LightningModule.
`import lowband` never imports lightning: only this module does.
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback

from lowband.integrations.world import World, wrapped_in_place
from lowband.wrapping import Sync


class LowbandCallback(Callback):
    """The method `spec` (NAME:KEY=VALUE:..., as `lowband.wrap` takes it) over `world`'s workers, run by a
    Lightning Trainer with one optimizer (see the module docstring)."""

    def __init__(self, spec: str, world: World | None = None, seed: int = 0, precision: str = "fp32",
                 timeout_s: float = 300.0):
        self.spec, self.world, self.seed, self.precision = spec, world or World(), seed, precision
        self.timeout_s = timeout_s
        self.sync: Sync | None = None
        self.bytes_sent = self.bytes_received = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        from lowband.errors import ConfigError

        if len(trainer.optimizers) != 1:
            raise ConfigError("optimizers", len(trainer.optimizers), "LowbandCallback trains a module with exactly one")
        steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        comm = self.world.communicator(next(pl_module.parameters()).device, self.timeout_s)
        try:
            self.sync = wrapped_in_place(pl_module, trainer.optimizers[0], self.spec, comm=comm,
                                         total_steps=max(int(steps), 1), seed=self.seed, precision=self.precision,
                                         gradient_hook=False)
        except BaseException:
            comm.close()
            raise

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """After the backward pass, before the update: the method's gradient exchange."""
        if self.sync is not None:
            self.sync.after_backward()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """After the optimizer's step: the method's exchanges due now."""
        if self.sync is not None:
            self.sync.step()

    def on_train_end(self, trainer, pl_module) -> None:
        """The method's final model into the module (every worker takes part), then the method closed."""
        if self.sync is None:
            return
        sync, self.sync = self.sync, None
        try:
            final = sync.final_model()
            if final is not pl_module:
                pl_module.load_state_dict(final.state_dict())
            self.bytes_sent, self.bytes_received = sync.bytes_sent, sync.bytes_received
            sync.comm.allreduce(torch.zeros(1), tag="barrier")  # no worker leaves while a peer still exchanges
        finally:
            sync.close()
            sync.comm.close()
