"""One worker's optimizer step, measured alone: what a dedicated machine would take per step.

A comparison's workers share this machine's cores, so the seconds they measured charge each method
for its neighbours' work (four workers on two cores run each step about four times slower than one
worker alone). The link projection for dedicated machines (lowband.comparison.projection) charges
instead, per step, the time measured here: the run's model, data, batch size, optimizer and thread
count (`train.threads`, one by default, as every worker uses), in this process, with nothing else
training. It times the plain step (forward, loss, backward, optimizer); a method's extra compute per
step (a codistillation peer's forward, an EDL student's soft labels) is not in it.

Results are kept in the comparison directory's calibration.json, one entry per distinct setting,
so a report or a resumed comparison does not measure again.
"""

from __future__ import annotations

import json
import time

import torch

from lowband import config as C
from lowband.atomic import write_text_atomic
from lowband.comparison.folder import ComparisonDir
from lowband.data import load_dataset
from lowband.models import build_for_task
from lowband.training.trainer import make_optimizer, resolve_device, task_loss

WARMUP, STEPS = 3, 12


def key(cfg: C.Config) -> str:
    """What the step time depends on: the model, the data (its shape), the batch, the optimizer, the device."""
    raw = C.to_dict(cfg)
    parts = {"model": raw["model"], "data": {k: raw["data"].get(k) for k in ("name", "num_samples", "context",
                                                                             "max_bytes", "image_size")},
             "batch": cfg.train.batch_size, "optim": raw["optim"].get("name"), "device": cfg.train.device}
    return json.dumps(parts, sort_keys=True)


def measure(cfg: C.Config, steps: int = STEPS, warmup: int = WARMUP) -> float:
    """Median seconds of one optimizer step of `cfg`'s model on its data, one thread, measured here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_dataset(cfg.data)
        device = resolve_device(cfg.train.device)
        torch.manual_seed(0)
        model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task).to(device)
        optimizer = make_optimizer(cfg.optim, model.parameters())
        n = min(cfg.train.batch_size, len(data.x_train))
        times = []
        for i in range(warmup + steps):
            idx = torch.randint(0, len(data.x_train), (n,))
            x, y = data.x_train[idx].to(device), data.y_train[idx].to(device)
            t0 = time.perf_counter()
            loss = task_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(threads)


def step_seconds(cfg: C.Config, folder: str) -> float:
    """`cfg`'s dedicated step time, from the folder's calibration.json or measured now (and kept there)."""
    path = ComparisonDir.of(folder).calibration_path
    known = read(path)
    k = key(cfg)
    if k not in known:
        known[k] = measure(cfg)
        write_text_atomic(path, json.dumps(known, indent=1))
    return known[k]


def read(path: str) -> dict[str, float]:
    """calibration.json's entries ({} when absent or unreadable: they are measured again)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}
