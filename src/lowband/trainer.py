"""The one training loop. It calls the method's hooks and never asks which method it runs."""

from __future__ import annotations

import json
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
    shards = METHODS.get(cfg.method.name).partition(cfg.method, data.y_train, world, cfg.train.seed)
    if shards is None:
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
        ctx = Context(cfg, comm, self.device, self.log, run_dir, self.plan.steps, self.plan.data,
                      self.plan.shards[self.rank], evaluate=self._evaluate, write_round=self._write_round)
        self.method: Method = method_cls(cfg.method, ctx)
        self.model = self.method.setup(model)
        augment = cfg.data.augment == "on" or (cfg.data.augment == "auto" and len(self.plan.data.in_shape) == 3
                                                and cfg.data.name in ("cifar10", "cifar100", "imagefolder"))
        self.batches = Batches(self.plan.data, self.plan.shards[self.rank], cfg.train.batch_size, self.plan.steps,
                               seed=cfg.train.seed * 131 + self.rank, augment=augment, device=self.device)
        warm = cfg.optim.warmup_epochs
        self.warmup = self.method.default_warmup_epochs() if warm == "auto" else float(warm)
        self.independent = method_cls.independent_models
        metrics_file = "metrics.jsonl" if self.rank == 0 else f"metrics.rank{self.rank}.jsonl"
        self.sink = MetricsSink(run_dir, self.rank == 0 or self.independent, cfg.train.epochs, self.log, metrics_file)
        self.reached_target: int | None = None
        self.final_global: torch.nn.Module | None = None  # the global model of the latest evaluated epoch
        self.best_local_rank = 0
        self.epoch, self.step, self.samples, self.elapsed, self.train_s = 0, 0, 0, 0.0, 0.0
        self.method_eval_s = 0.0  # evaluations a method asked for inside training hooks

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> None:
        if resume:
            self._resume()
        if self.epoch == 0 and self.rank == 0:
            self.log.info(self._banner())
        for epoch in range(self.epoch + 1, self.cfg.train.epochs + 1):
            self._run_epoch(epoch)
            if self._should_stop():
                self.log.info(f"stopping at epoch {epoch}: test accuracy reached {self.cfg.train.target_accuracy}")
                break
        self._save_final()

    def _should_stop(self) -> bool:
        if not self.cfg.train.stop_at_target:
            return False
        flag = torch.tensor([1.0 if self.reached_target is not None else 0.0], device=self.device)
        if not self.independent:  # everyone follows rank 0, whose model is the one reported
            self.comm.broadcast(flag, src=0, tag="control")
        return bool(flag.item())

    def _run_epoch(self, epoch: int) -> None:
        t_start, comm_before, wait_before = time.perf_counter(), self._comm_seconds(), self._wait_seconds()
        eval_before = self.method_eval_s
        loss_sum, data_wait = 0.0, 0.0
        batches = iter(self.method.batches(epoch, self.batches))
        for i in self.sink.steps(range(self.plan.steps), epoch, self.plan.steps):
            t0 = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - t0
            self._set_lr(epoch - 1 + i / self.plan.steps)
            loss_sum += self._train_step(batch)
        hook_eval_s = self.method_eval_s - eval_before
        train_s = time.perf_counter() - t_start - hook_eval_s
        comm_s = self._comm_seconds() - comm_before
        wait_s = self._wait_seconds() - wait_before + data_wait
        extra = self.method.end_epoch(epoch)
        self.epoch, self.samples = epoch, self.samples + self.plan.steps * self.cfg.train.batch_size
        self.train_s += train_s
        times = {"compute_s": max(train_s - comm_s - wait_s, 0.0), "comm_s": comm_s, "wait_s": wait_s,
                 "hook_eval_s": hook_eval_s, "epoch_train_s": train_s}
        self._finish_epoch(epoch, loss_sum / self.plan.steps, times, t_start, extra)

    def _train_step(self, batch) -> float:
        outputs = self.model(batch.x)
        loss = self.method.loss(batch, outputs, F.cross_entropy(outputs, batch.y))
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

    def close(self) -> None:
        self.method.close()

    # ---- accounting ----------------------------------------------------------------------------
    def _comm_seconds(self) -> float:
        return sum(s.seconds for tag, s in self.comm.stats.items() if tag not in BOOKKEEPING_TAGS)

    def _wait_seconds(self) -> float:
        return self.comm.stats["barrier"].seconds if "barrier" in self.comm.stats else 0.0

    def _training_bytes(self) -> tuple[float, float]:
        tags = [s for tag, s in self.comm.stats.items() if tag not in BOOKKEEPING_TAGS]
        return sum(s.sent for s in tags), sum(s.recv for s in tags)

    def _evaluate(self, model: torch.nn.Module) -> float:
        t0 = time.perf_counter()
        d = self.plan.data
        acc = accuracy(model, d.x_test, d.y_test, self.cfg.train.eval_batch_size, self.device)
        self.method_eval_s += time.perf_counter() - t0
        return acc

    def _write_round(self, record: dict) -> None:
        if self.rank == 0:
            with open(os.path.join(self.run_dir, "rounds.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")

    def _finish_epoch(self, epoch: int, loss: float, times: dict, t_start: float, extra: dict) -> None:
        t_eval = time.perf_counter()
        last = epoch == self.cfg.train.epochs
        evaluate = epoch % self.cfg.train.eval_every == 0 or last
        d, bs = self.plan.data, self.cfg.train.eval_batch_size
        local = accuracy(self.method.local_model(), d.x_test, d.y_test, bs, self.device) if evaluate else float("nan")
        glob = self.method.global_model(final=last) if evaluate else None
        glob_acc = accuracy(glob, d.x_test, d.y_test, bs, self.device) if glob is not None and self.rank == 0 else None
        times["eval_s"] = time.perf_counter() - t_eval
        sent, recv = self._training_bytes()
        mine = torch.tensor([loss, local, sent, recv, self.plan.steps * self.cfg.train.batch_size], dtype=torch.float64)
        ranks = mine[None] if self.independent else torch.stack(self.comm.all_gather(mine.to(self.device), tag="metrics")).cpu()
        if not math.isfinite(float(ranks[:, 0].max())):
            raise TrainingError(f"training diverged in epoch {epoch} (loss {float(ranks[:, 0].max())}); lower optim.lr")
        self.elapsed += time.perf_counter() - t_start
        self.best_local_rank = int(ranks[:, 0].argmin())
        record = epoch_record(self, epoch, ranks, glob_acc if evaluate else None, evaluate, times)
        target = self.cfg.train.target_accuracy
        if target and self.reached_target is None and evaluate and record["test_acc"] >= target:
            self.reached_target = epoch
            self.log.info(f"epoch {epoch}: test accuracy {record['test_acc']:.4f} reached the target {target}")
        record["reached_target_epoch"] = self.reached_target
        self.sink.write({**record, **extra})
        every = self.cfg.train.checkpoint_every
        if (every and epoch % every == 0) or last:
            self._save_checkpoint(epoch)
        if evaluate:  # the stopping epoch of an early stop is always evaluated
            self.final_global = glob

    def _save_final(self) -> None:
        """model.safetensors: the global model if the method has one, else this rank's; model_L too."""
        glob = self.final_global
        if self.independent and self.rank > 0:
            path = os.path.join(self.run_dir, f"model.rank{self.rank}.safetensors")
            checkpoint.save_model(self.method.local_model().state_dict(), path)
        if self.rank == 0:
            final = glob if glob is not None else self.method.local_model()
            checkpoint.save_model(final.state_dict(), os.path.join(self.run_dir, "model.safetensors"))
        if glob is not None and self.rank == self.best_local_rank:
            checkpoint.save_model(self.method.local_model().state_dict(), os.path.join(self.run_dir, "model_L.safetensors"))

    # ---- checkpoints ---------------------------------------------------------------------------
    def _save_checkpoint(self, epoch: int) -> None:
        state = {
            "epoch": epoch, "step": self.step, "samples": self.samples, "elapsed": self.elapsed,
            "model": self.method.local_model().state_dict(), "reached_target": self.reached_target or 0,
            "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
            "comm": self.comm.snapshot(), "rng": torch.get_rng_state(), "train_s": self.train_s,
        }
        checkpoint.save_state(state, checkpoint.rank_path(self.run_dir, self.rank, epoch))
        checkpoint.prune(self.run_dir, self.rank)

    def _resume(self) -> None:
        if self.independent:
            epoch = max(checkpoint.epochs_saved(self.run_dir, self.rank), default=0)
            agreed = [torch.tensor([epoch])]
        else:
            epoch = checkpoint.latest_common_epoch(self.run_dir, self.world)
            agreed = self.comm.all_gather(torch.tensor([epoch], device=self.device), tag="control")
        if len({int(t.item()) for t in agreed}) != 1:
            raise TrainingError(f"ranks see different checkpoints ({[int(t) for t in agreed]}); is the run dir shared?")
        if epoch == 0:
            self.log.warning(f"no checkpoint in {self.run_dir}; starting from scratch")
            self.sink.keep_until(0)
            return
        state = checkpoint.load_state(checkpoint.rank_path(self.run_dir, self.rank, epoch))
        self.method.local_model().load_state_dict(state["model"])
        self.reached_target = state.get("reached_target") or None
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        self.comm.load_snapshot(state["comm"])
        torch.set_rng_state(state["rng"])
        self.epoch, self.step, self.samples, self.elapsed = state["epoch"], state["step"], state["samples"], state["elapsed"]
        self.train_s = state.get("train_s", 0.0)
        self.sink.keep_until(epoch)
        self.log.info(f"resumed {self.run_dir} after epoch {epoch} (step {self.step})")

    def _banner(self) -> str:
        c, d = self.cfg, self.plan.data
        params = sum(p.numel() for p in self.method.local_model().parameters())
        return (f"{c.method.name}: {self.world} worker(s), backend {self.comm.backend}, device {self.device}; "
                f"{c.data.name} {len(d.y_train)} train / {len(d.y_test)} test, partition {c.data.partition}; "
                f"{c.model.name} {params:,} parameters; {self.plan.steps} steps/epoch x {c.train.epochs} epochs, "
                f"batch {c.train.batch_size}/worker; run dir {self.run_dir}")


def epoch_record(t: Trainer, epoch: int, ranks: torch.Tensor, glob_acc: float | None, evaluated: bool,
                 times: dict) -> dict:
    """One metrics.jsonl line. `ranks` holds per rank: loss, local test acc, bytes sent, received, samples.

    test_acc is the method's global model when it has one, else rank 0's model; test_acc_L is the
    local model with the smallest training loss this epoch (the EC-DNN paper's "_L").
    """
    local = [float(a) for a in ranks[:, 1]]
    best = int(ranks[:, 0].argmin())
    return {
        "epoch": epoch, "steps": t.step, "samples": int(ranks[:, 4].sum()) * epoch,
        "samples_per_s": round(float(ranks[:, 4].sum()) / max(times["epoch_train_s"], 1e-9), 2),
        "train_loss": float(ranks[:, 0].mean()), "train_loss_ranks": [float(x) for x in ranks[:, 0]],
        "test_acc": (glob_acc if glob_acc is not None else local[0]) if evaluated else None,
        "test_acc_L": local[best] if evaluated else None,
        "test_acc_ranks": local if evaluated else None,
        "lr": t.optimizer.param_groups[0]["lr"],
        "bytes_sent_per_worker": float(ranks[:, 2].mean()), "bytes_recv_per_worker": float(ranks[:, 3].mean()),
        "bytes": {tag: {"sent": s.sent, "recv": s.recv} for tag, s in sorted(t.comm.stats.items()) if s.sent or s.recv},
        "time": {**{k: round(v, 4) for k, v in times.items()}, "train_s": round(t.train_s, 4),
                 "elapsed_s": round(t.elapsed, 4)},
    }
