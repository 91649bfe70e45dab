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

from lightning.pytorch.callbacks import Callback

from lowband.integrations.world import TrainerMethod


class LowbandCallback(Callback, TrainerMethod):
    """The method `spec` (NAME:KEY=VALUE:..., as `lowband.wrap` takes it) over `world`'s workers, run by a
    Lightning Trainer with one optimizer (see the module docstring)."""

    def on_train_start(self, trainer, pl_module) -> None:
        from lowband.errors import ConfigError

        if len(trainer.optimizers) != 1:
            raise ConfigError("optimizers", len(trainer.optimizers), "LowbandCallback trains a module with exactly one")
        steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        self.start(pl_module, trainer.optimizers[0], steps, gradient_hook=False)

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
        self.finish(pl_module)
