"""The one training loop. It calls the method's hooks and never asks which method it runs."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lowband import checkpoint
from lowband.comm import BOOKKEEPING_TAGS, Communicator
from lowband.config import Config
from lowband.data import Batches, TensorData, load_dataset, partition, steps_per_epoch
from lowband.methods.base import Context, Method
from lowband.metrics import MetricsSink, setup_logging
from lowband.models import build_model
from lowband.registry import METHODS
from lowband.schedule import lr_at


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, inconsistent checkpoints); exit code 1."""


@dataclass
class Plan:
    """What every rank derives from the config alone: data, shards, steps per epoch."""

    data: TensorData
    shards: list[torch.Tensor]
    steps: int


def make_plan(cfg: Config, world: int) -> Plan:
    data = load_dataset(cfg.data)
    shards = partition(data.y_train, world, cfg.data.partition, cfg.train.seed, cfg.data.alpha)
    return Plan(data, shards, steps_per_epoch(shards, cfg.train.batch_size))


def resolve_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            from lowband.errors import ConfigError
            raise ConfigError("train.device", requested, "CUDA is not available here; use 'cpu' or 'auto'")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def make_optimizer(cfg, params):
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
                           weight_decay=cfg.weight_decay)


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, device) -> float:
    was_training = model.training
    model.eval()
    correct = sum((model(x[i:i + batch].to(device)).argmax(1).cpu() == y[i:i + batch]).sum().item()
                  for i in range(0, len(x), batch))
    model.train(was_training)
    return correct / max(len(x), 1)


class Trainer:
    def __init__(self, cfg: Config, comm: Communicator, run_dir: str):
        self.cfg, self.comm, self.run_dir = cfg, comm, run_dir
        self.rank, self.world = comm.rank, comm.world
        self.log = setup_logging(run_dir, self.rank)
        self.device = comm.device
        self.plan = make_plan(cfg, self.world)
        method_cls = METHODS.get(cfg.method.name)
        torch.manual_seed(cfg.train.seed if method_cls.same_init else cfg.train.seed + 7919 * self.rank)
        model = build_model(cfg.model, self.plan.data.in_shape, self.plan.data.num_classes).to(self.device)
        self.optimizer = make_optimizer(cfg.optim, model.parameters())
        ctx = Context(cfg, comm, self.device, self.log, run_dir, self.plan.steps)
        self.method: Method = method_cls(cfg.method, ctx)
        self.model = self.method.setup(model)
        augment = cfg.data.augment == "on" or (cfg.data.augment == "auto" and len(self.plan.data.in_shape) == 3
                                                and cfg.data.name in ("cifar10", "cifar100", "imagefolder"))
        self.batches = Batches(self.plan.data, self.plan.shards[self.rank], cfg.train.batch_size, self.plan.steps,
                               seed=cfg.train.seed * 131 + self.rank, augment=augment, device=self.device)
        warm = cfg.optim.warmup_epochs
        self.warmup = self.method.default_warmup_epochs() if warm == "auto" else float(warm)
        self.sink = MetricsSink(run_dir, self.rank == 0, cfg.train.epochs, self.log)
        self.epoch, self.step, self.samples, self.elapsed = 0, 0, 0, 0.0

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> None:
        if resume:
            self._resume()
        if self.epoch == 0 and self.rank == 0:
            self.log.info(self._banner())
        for epoch in range(self.epoch + 1, self.cfg.train.epochs + 1):
            self._run_epoch(epoch)
        if self.rank == 0:
            checkpoint.save_model(self.method.eval_model().state_dict(), os.path.join(self.run_dir, "model.safetensors"))

    def _run_epoch(self, epoch: int) -> None:
        t_start, comm_before, wait_before = time.perf_counter(), self._comm_seconds(), self._wait_seconds()
        loss_sum, data_wait = 0.0, 0.0
        batches = iter(self.batches.epoch(epoch))
        for i in self.sink.steps(range(self.plan.steps), epoch, self.plan.steps):
            t0 = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - t0
            self._set_lr(epoch - 1 + i / self.plan.steps)
            loss_sum += self._train_step(batch)
        train_s = time.perf_counter() - t_start
        comm_s = self._comm_seconds() - comm_before
        wait_s = self._wait_seconds() - wait_before + data_wait
        extra = self.method.end_epoch(epoch)
        self.epoch, self.samples = epoch, self.samples + self.plan.steps * self.cfg.train.batch_size
        times = {"compute_s": max(train_s - comm_s - wait_s, 0.0), "comm_s": comm_s, "wait_s": wait_s}
        self._finish_epoch(epoch, loss_sum / self.plan.steps, times, t_start, extra)

    def _train_step(self, batch) -> float:
        x, y, _ = batch
        outputs = self.model(x)
        loss = self.method.loss(batch, outputs, F.cross_entropy(outputs, y))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.method.after_backward(self.step)
        self.optimizer.step()
        self.method.after_step(self.step)
        self.step += 1
        return loss.item()

    def _set_lr(self, epoch: float) -> None:
        lr = lr_at(epoch, self.cfg.optim, self.cfg.train.epochs, self.method.lr_scale(), self.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---- accounting ----------------------------------------------------------------------------
    def _comm_seconds(self) -> float:
        return sum(s.seconds for tag, s in self.comm.stats.items() if tag not in BOOKKEEPING_TAGS)

    def _wait_seconds(self) -> float:
        return self.comm.stats["barrier"].seconds if "barrier" in self.comm.stats else 0.0

    def _training_bytes(self) -> tuple[float, float]:
        tags = [s for tag, s in self.comm.stats.items() if tag not in BOOKKEEPING_TAGS]
        return sum(s.sent for s in tags), sum(s.recv for s in tags)

    def _finish_epoch(self, epoch: int, loss: float, times: dict, t_start: float, extra: dict) -> None:
        t_eval = time.perf_counter()
        evaluate = epoch % self.cfg.train.eval_every == 0 or epoch == self.cfg.train.epochs
        d = self.plan.data
        acc = accuracy(self.method.eval_model(), d.x_test, d.y_test, self.cfg.train.eval_batch_size,
                       self.device) if evaluate else float("nan")
        times["eval_s"] = time.perf_counter() - t_eval
        sent, recv = self._training_bytes()
        mine = torch.tensor([loss, acc, sent, recv, self.plan.steps * self.cfg.train.batch_size], dtype=torch.float64)
        ranks = torch.stack(self.comm.all_gather(mine.to(self.device), tag="metrics")).cpu()
        if not math.isfinite(float(ranks[:, 0].max())):
            raise TrainingError(f"training diverged in epoch {epoch} (loss {float(ranks[:, 0].max())}); lower optim.lr")
        self.elapsed += time.perf_counter() - t_start
        record = {
            "epoch": epoch, "steps": self.step, "samples": int(ranks[:, 4].sum()) * epoch,
            "train_loss": float(ranks[:, 0].mean()), "test_acc": acc if evaluate else None,
            "test_acc_ranks": [float(a) for a in ranks[:, 1]] if evaluate else None,
            "lr": self.optimizer.param_groups[0]["lr"],
            "bytes_sent_per_worker": float(ranks[:, 2].mean()), "bytes_recv_per_worker": float(ranks[:, 3].mean()),
            "bytes": {tag: {"sent": s.sent, "recv": s.recv} for tag, s in sorted(self.comm.stats.items())
                      if s.sent or s.recv},
            "time": {**{k: round(v, 4) for k, v in times.items()}, "elapsed_s": round(self.elapsed, 4)},
            **extra,
        }
        self.sink.write(record)
        every = self.cfg.train.checkpoint_every
        if (every and epoch % every == 0) or epoch == self.cfg.train.epochs:
            self._save_checkpoint(epoch)

    # ---- checkpoints ---------------------------------------------------------------------------
    def _save_checkpoint(self, epoch: int) -> None:
        state = {
            "epoch": epoch, "step": self.step, "samples": self.samples, "elapsed": self.elapsed,
            "model": getattr(self.model, "module", self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
            "comm": self.comm.snapshot(), "rng": torch.get_rng_state(),
        }
        checkpoint.save_state(state, checkpoint.rank_path(self.run_dir, self.rank, epoch))
        checkpoint.prune(self.run_dir, self.rank)

    def _resume(self) -> None:
        epoch = checkpoint.latest_common_epoch(self.run_dir, self.world)
        agreed = self.comm.all_gather(torch.tensor([epoch], device=self.device), tag="control")
        if len({int(t.item()) for t in agreed}) != 1:
            raise TrainingError(f"ranks see different checkpoints ({[int(t) for t in agreed]}); is the run dir shared?")
        if epoch == 0:
            self.log.warning(f"no checkpoint in {self.run_dir}; starting from scratch")
            return
        state = checkpoint.load_state(checkpoint.rank_path(self.run_dir, self.rank, epoch))
        getattr(self.model, "module", self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        self.comm.load_snapshot(state["comm"])
        torch.set_rng_state(state["rng"])
        self.epoch, self.step, self.samples, self.elapsed = state["epoch"], state["step"], state["samples"], state["elapsed"]
        self.sink.keep_until(epoch)
        self.log.info(f"resumed {self.run_dir} after epoch {epoch} (step {self.step})")

    def _banner(self) -> str:
        c, d = self.cfg, self.plan.data
        params = sum(p.numel() for p in self.method.eval_model().parameters())
        return (f"{c.method.name}: {self.world} worker(s), backend {self.comm.backend}, device {self.device}; "
                f"{c.data.name} {len(d.y_train)} train / {len(d.y_test)} test, partition {c.data.partition}; "
                f"{c.model.name} {params:,} parameters; {self.plan.steps} steps/epoch x {c.train.epochs} epochs, "
                f"batch {c.train.batch_size}/worker; run dir {self.run_dir}")
