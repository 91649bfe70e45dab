"""A plain PyTorch DDP training loop: the yardstick for lowband's overhead (run by torchrun).

Same model (cnn1d), data (MNIST-1D), per-worker batch and optimizer as `lowband train --method
allreduce`; nothing of lowband's but the data set and the model definition.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from lowband.config import DataConfig, ModelConfig
from lowband.data import load_dataset
from lowband.models import build_model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_dataset(DataConfig(name="mnist1d"))
    shard = torch.randperm(len(data.y_train), generator=torch.Generator().manual_seed(0)).chunk(world)[rank]
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(ModelConfig(name="cnn1d"), data.in_shape, data.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05 * world, momentum=0.9, weight_decay=5e-4)
    steps = len(shard) // a.batch
    per_epoch = []
    for epoch in range(a.epochs):
        order = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))]
        t0 = time.perf_counter()
        for s in range(steps):
            ids = order[s * a.batch:(s + 1) * a.batch]
            loss = F.cross_entropy(model(data.x_train[ids]), data.y_train[ids])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        per_epoch.append((time.perf_counter() - t0) / steps)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"step_s": per_epoch, "steps_per_epoch": steps}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
