"""lowband's methods inside Hugging Face's `transformers.Trainer`, as a TrainerCallback (`pip install lowband[hf]`).

    from lowband.integrations.hf import LowbandCallback, take_world

    world = take_world()                              # first, before TrainingArguments: see below
    sync = LowbandCallback("diloco:tau=16", world)
    trainer = Trainer(model, args, train_dataset=my_shard(world.rank, world.size), callbacks=[sync])
    trainer.train()                                   # at the end trainer.model holds the method's final model
    sync.bytes_sent                                   # what this worker sent, as lowband's ledger counts it

Under torchrun every Trainer would wrap its model in DistributedDataParallel and average the gradients at
every step, which is what a low-communication method exists to avoid. `take_world()` takes torchrun's
variables out of the environment, so that each process's Trainer trains alone, and keeps them in a `World`;
the callback then joins the workers itself, over a gloo group of its own on torchrun's rendezvous store, for
the method's exchanges only. Give each worker its own data (its shard of the dataset, or its own stream).

The callback calls `lowband.wrap` on the Trainer's model and optimizer when training begins (`state.max_steps`
is the run's length), steps the method after every optimizer step, and at the end loads the method's final
model (DiLoCo's θ_global after its last outer step, the workers' average) into the Trainer's model and closes
the method; `callback.sync` is wrap's `Sync` while it trains. The Trainer's own learning-rate schedule runs;
the method's rule on it (DiLoCo's inner_lr_factor) is not applied here. `import lowband` never imports
transformers: only this module does.
"""

from __future__ import annotations

from transformers import TrainerCallback

from lowband.integrations.world import TrainerMethod, World, take_world

__all__ = ["LowbandCallback", "World", "take_world"]

class LowbandCallback(TrainerCallback, TrainerMethod):
    """The method `spec` (NAME:KEY=VALUE:..., as `lowband.wrap` takes it) over `world`'s workers, run by a
    Trainer (see the module docstring). `seed`: a stochastic codec's; `precision`: wrap's."""

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.start(model, getattr(optimizer, "optimizer", optimizer), state.max_steps)  # accelerate's wrapper

    def on_step_end(self, args, state, control, **kwargs):
        """After the optimizer's step (and the scheduler's): the method's exchanges due now."""
        if self.sync is not None:
            self.sync.step()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        """The method's final model into the Trainer's (every worker takes part), then the method closed."""
        self.finish(model)
