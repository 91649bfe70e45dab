"""Lightning's `Trainer` with a lowband method: a GPT-2 (built from a config, nothing downloaded) trained with
DiLoCo under torchrun on the CPU, through `lowband.integrations.lightning`.

    pip install 'lowband[lightning]'
    python -m torch.distributed.run --nproc-per-node 2 examples/lightning_trainer.py --steps 40

Each worker streams its own windows of the text into its own Trainer (one device each: the callback, not
Lightning's DDP, joins the workers); every tau steps they take DiLoCo's outer step. At the end every module
holds θ_global, and rank 0 prints its held-out loss and the bytes each worker sent. `--loop own` trains the
same stream, model and optimizer in a plain loop through `lowband.wrap`: the suite checks that both end with
the same parameters and bytes (tests/distributed/test_integrations.py).
"""

from __future__ import annotations

import torch

from hf_trainer import Windows, main
from lowband.integrations.world import World


def module_of(model: torch.nn.Module, lr: float):
    """The user's LightningModule: the GPT-2's own loss, AdamW at a constant rate."""
    import lightning.pytorch as pl

    class CausalLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    return CausalLM()


def with_trainer(args, world: World, model, stream: Windows) -> tuple[torch.nn.Module, float]:
    import lightning.pytorch as pl

    from lowband.integrations.lightning import LowbandCallback

    sync = LowbandCallback(args.method, world)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, callbacks=[sync], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=args.out or None)
    module = module_of(model, args.lr)
    trainer.fit(module, torch.utils.data.DataLoader(stream, batch_size=args.batch))
    return module.model, sync.bytes_sent


if __name__ == "__main__":
    main(__doc__, "Lightning", with_trainer, prefix="lightning-")
