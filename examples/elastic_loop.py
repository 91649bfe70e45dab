"""Your own loop on workers that come and go: DiLoCo over an elastic job, in plain processes on the CPU.

    lowband coordinator                                  # an embedded Redis; prints its URL (keep it running)
    python examples/elastic_loop.py --coordinator URL --workers 3 &   # three times: the launched workers
    python examples/elastic_loop.py --coordinator URL --workers 3 &
    python examples/elastic_loop.py --coordinator URL --workers 3 &
    kill -9 %2                                           # one leaves: the others train on without it
    python examples/elastic_loop.py --coordinator URL --workers 3     # one joins: it takes θ_global and the clock

Each worker fits a small MLP to a noisy linear map, on its own stream of samples (seeded by its id in the
job); every --tau steps the workers there take DiLoCo's outer step together (`lowband.wrap(...,
elastic=URL)`). The loop runs until the job's clock reaches --steps (`sync.done`), so a joiner ends with the
others. Each worker prints the final model's held-out loss; with --out it writes the final model and its
bytes there. Without --coordinator the same loop runs under torchrun, a fixed world (`--loop fixed`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import lowband

IN, OUT = 16, 4


def task(seed: int = 1234) -> torch.Tensor:
    """The map every worker learns: one fixed matrix."""
    return torch.randn(IN, OUT, generator=torch.Generator().manual_seed(seed))


def batches(worker: int, size: int, weights: torch.Tensor):
    """Worker `worker`'s own endless stream of (x, y) pairs."""
    g = torch.Generator().manual_seed(1000 + worker)
    while True:
        x = torch.randn(size, IN, generator=g)
        yield x, x @ weights + 0.1 * torch.randn(size, OUT, generator=g)


def model_for(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)  # every worker starts from one θ, so the first round moves nothing
    return torch.nn.Sequential(torch.nn.Linear(IN, 32), torch.nn.Tanh(), torch.nn.Linear(32, OUT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--coordinator", default="", help="the elastic job's Redis URL (`lowband coordinator` prints one); "
                                                     "empty: a fixed world under torchrun")
    p.add_argument("--job", default="elastic-loop", help="the job's name on the coordinator")
    p.add_argument("--workers", type=int, default=3, help="workers launched together (the first round waits for them)")
    p.add_argument("--steps", type=int, default=120, help="the job's length in inner steps")
    p.add_argument("--method", default="diloco:tau=4:outer_lr=0.1", help="NAME:KEY=VALUE:... (an elastic method)")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each step (to watch churn)")
    p.add_argument("--out", default="", help="a folder for final-ID.safetensors and bytes-ID.json")
    p.add_argument("--set", action="append", default=[], metavar="elastic.KEY=VALUE",
                   help="an elastic option (e.g. elastic.dead_after_s=2; `lowband config` lists them)")
    args = p.parse_args()
    torch.set_num_threads(1)

    model, weights = model_for(), task()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    options = {k.removeprefix("elastic."): json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    elastic = {"elastic": args.coordinator, "job": args.job, "workers": args.workers,
               "config": {"elastic": options}} if args.coordinator else {}
    with lowband.wrap(model, optimizer, args.method, total_steps=args.steps, **elastic) as sync:
        stream = batches(sync.rank, args.batch, weights)
        while not sync.done:
            x, y = next(stream)
            F.mse_loss(sync.model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            sync.step()
            time.sleep(args.pause)
        final = sync.final_model()
        x, y = next(batches(10_000, 1000, weights))
        with torch.no_grad():
            loss = F.mse_loss(final(x), y).item()
        print(f"worker {sync.rank}: final model's held-out loss {loss:.4f}, {sync.bytes_sent / 1e3:.1f} kB sent, "
              f"{sync.steps} steps trained here", flush=True)
        if args.out:
            save_file({k: v.contiguous() for k, v in final.state_dict().items()},
                      os.path.join(args.out, f"final-{sync.rank}.safetensors"))
            with open(os.path.join(args.out, f"bytes-{sync.rank}.json"), "w") as f:
                json.dump({"by_tag": sync.bytes_by_tag(), "received": sync.bytes_received, "steps": sync.steps,
                           "loss": loss}, f)


if __name__ == "__main__":
    main()
