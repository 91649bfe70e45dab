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

import argparse
import json
import math
import os

import torch

from hf_trainer import Windows, gpt2, windows, with_own_loop
from lowband.integrations.world import World, take_world


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per worker")
    p.add_argument("--method", default="diloco:tau=8:outer_lr=0.7", help="a lowband method, NAME:KEY=VALUE:...")
    p.add_argument("--loop", choices=("trainer", "own"), default="trainer", help="Lightning's Trainer, or a plain loop")
    p.add_argument("--bytes", type=int, default=200_000, help="the KJV's first bytes to use")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default="", help="write each worker's final model and figures into this folder")
    args = p.parse_args()
    world = take_world()  # before the Trainer: each trains its process alone, the callback joins the workers
    torch.set_num_threads(1)

    from lowband.data.text import read_corpus

    _, text = read_corpus("text", args.bytes)
    data = windows(text, args.context)
    held_out, train = data[: len(data) // 10], data[len(data) // 10:]
    run = with_trainer if args.loop == "trainer" else with_own_loop
    model, sent = run(args, world, gpt2(args.context), Windows(train, world.rank, world.size))
    with torch.no_grad():
        model.eval()
        loss = model(input_ids=held_out[:256], labels=held_out[:256]).loss.item()
    if args.out:
        from safetensors.torch import save_file

        os.makedirs(args.out, exist_ok=True)
        save_file({name: p.detach().clone() for name, p in model.named_parameters()},
                  os.path.join(args.out, f"lightning-{args.loop}-rank{world.rank}.safetensors"))
        with open(os.path.join(args.out, f"lightning-{args.loop}-rank{world.rank}.json"), "w") as f:
            json.dump({"bytes_sent": sent, "held_out_loss": loss}, f)
    if world.rank == 0:
        print(f"{args.loop}: final model held-out loss {loss:.4f} nats ({loss / math.log(2):.3f} bits per byte); "
              f"{sent / 1e6:.3f} MB sent by each worker ({args.method})", flush=True)


if __name__ == "__main__":
    main()
