"""Hugging Face's `transformers.Trainer` with a lowband method: a GPT-2 (built from a config, nothing
downloaded) trained with DiLoCo under torchrun on the CPU, through `lowband.integrations.hf`.

    pip install 'lowband[hf]'
    python -m torch.distributed.run --nproc-per-node 2 examples/hf_trainer.py --steps 40

Each worker streams its own windows of the text (the KJV by default, or --text FILE) into its own Trainer;
every tau steps the workers average their pseudo-gradients and take DiLoCo's outer step. At the end every
Trainer's model holds θ_global, and rank 0 prints its held-out loss and the bytes each worker sent.

`--loop own` trains the same stream, model and optimizer in a plain loop with `lowband.wrap` instead: the
suite checks that both end with the same parameters and bytes (tests/distributed/test_integrations.py).
`--out DIR` writes each worker's final model and figures there.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
from torch.utils.data import IterableDataset

import lowband
from lowband.integrations.hf import LowbandCallback, World, take_world


class Windows(IterableDataset):
    """This worker's windows of the text in order, `rank::world`, as a Trainer's stream of examples. The first
    label is -100 (ignored), so the mean over the counted labels is the mean over the predicted bytes."""

    def __init__(self, data: torch.Tensor, rank: int, world: int):
        self.data = data[rank::world]

    def __iter__(self):
        for window in self.data:
            labels = window.clone()
            labels[0] = -100
            yield {"input_ids": window, "labels": labels}


def windows(text: bytes, context: int) -> torch.Tensor:
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    n = len(data) // context
    return data[: n * context].view(n, context)


def gpt2(context: int) -> torch.nn.Module:
    """A small GPT-2 without dropout (so a Trainer and a plain loop train the same numbers)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)  # every worker starts from the same weights
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=context, n_layer=2, n_head=2, n_embd=32,
                                      bos_token_id=255, eos_token_id=255, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def with_trainer(args, world: World, model, stream: Windows) -> tuple[torch.nn.Module, float]:
    from transformers import Trainer, TrainingArguments

    targs = TrainingArguments(output_dir=os.path.join(args.out or "runs/hf_trainer", f"rank{world.rank}"),
                              max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=args.lr,
                              lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, optim="adamw_torch",
                              use_cpu=True, report_to=[], save_strategy="no", logging_steps=max(args.steps // 4, 1),
                              disable_tqdm=True, dataloader_num_workers=0, seed=0)
    sync = LowbandCallback(args.method, world)
    Trainer(model=model, args=targs, train_dataset=stream, callbacks=[sync]).train()
    return model, sync.bytes_sent


def with_own_loop(args, world: World, model, stream: Windows) -> tuple[torch.nn.Module, float]:
    """The same training in a plain loop: the stream's batches in order, AdamW at a constant rate."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    batches = torch.utils.data.DataLoader(stream, batch_size=args.batch)
    with lowband.wrap(model, optimizer, args.method, comm=world.communicator(torch.device("cpu")),
                      total_steps=args.steps) as sync:
        for _, batch in zip(range(args.steps), batches, strict=False):
            sync.model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            sync.step()
        final = sync.final_model()
        model.load_state_dict(final.state_dict())
        sent = sync.bytes_sent
        sync.comm.allreduce(torch.zeros(1), tag="barrier")
    sync.comm.close()
    return model, sent


def arguments(doc: str, trainer: str) -> argparse.Namespace:
    """The examples' command line (`trainer`: whose Trainer --loop trainer runs)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per worker")
    p.add_argument("--method", default="diloco:tau=8:outer_lr=0.7", help="a lowband method, NAME:KEY=VALUE:...")
    p.add_argument("--loop", choices=("trainer", "own"), default="trainer", help=f"{trainer}'s Trainer, or a plain loop")
    p.add_argument("--text", default="", help="a UTF-8 text file (default: the KJV)")
    p.add_argument("--bytes", type=int, default=200_000, help="the text's first bytes to use")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default="", help="write each worker's final model and figures into this folder")
    return p.parse_args()


def split_text(args) -> tuple[torch.Tensor, torch.Tensor]:
    """The text's windows: the first tenth held out, the rest to train on."""
    from lowband.data.text import read_corpus

    _, text = read_corpus(f"text:{args.text}" if args.text else "text", args.bytes)
    data = windows(text, args.context)
    return data[: len(data) // 10], data[len(data) // 10:]


def main(doc: str, trainer: str, train_with, prefix: str = "") -> None:
    """Train with `trainer`'s Trainer (`train_with`, as `with_trainer` here) or the plain loop, then report."""
    args = arguments(doc, trainer)
    world = take_world()  # before any Trainer: each trains its process alone, the callback joins the workers
    torch.set_num_threads(1)
    held_out, train = split_text(args)
    run = train_with if args.loop == "trainer" else with_own_loop
    model, sent = run(args, world, gpt2(args.context), Windows(train, world.rank, world.size))
    report(args, world, model, sent, held_out, prefix)

def report(args, world: World, model, sent: float, held_out: torch.Tensor, prefix: str = "") -> None:
    """The final model's held-out loss (rank 0 prints it, with the bytes); with --out, each worker's model and
    figures, PREFIX+LOOP-rankR.safetensors / .json."""
    with torch.no_grad():
        model.eval()
        loss = model(input_ids=held_out[:256], labels=held_out[:256]).loss.item()
    if args.out:
        from safetensors.torch import save_file

        os.makedirs(args.out, exist_ok=True)
        save_file({name: p.detach().clone() for name, p in model.named_parameters()},  # tied weights once
                  os.path.join(args.out, f"{prefix}{args.loop}-rank{world.rank}.safetensors"))
        with open(os.path.join(args.out, f"{prefix}{args.loop}-rank{world.rank}.json"), "w") as f:
            json.dump({"bytes_sent": sent, "held_out_loss": loss}, f)
    if world.rank == 0:
        print(f"{args.loop}: final model held-out loss {loss:.4f} nats ({loss / math.log(2):.3f} bits per byte); "
              f"{sent / 1e6:.3f} MB sent by each worker ({args.method})", flush=True)


if __name__ == "__main__":
    main(__doc__, "Hugging Face", with_trainer)
