"""The one training loop. It calls the method's hooks and never asks which method it runs.

`train_step` is one optimizer step with the hooks in their fixed order (tests drive methods with
it too); `Trainer` runs the epochs, evaluates, checkpoints and hands each epoch's figures to the
epoch reporter (reporter.py), which owns the metrics records.

An elastic job's worker (elastic_worker.py) shares this module's pieces rather than copying them:
the data plan (`worker_data`, `rank_batches`), the step (`checked_step`), the rate (schedule.py's
`MethodSchedule`), the evaluation (`model_scores`), which epochs are evaluated and checkpointed (`due`)
and the saved model's metadata (`model_metadata`).
"""

from __future__ import annotations

import json
import math
import time
import traceback
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from lowband import __version__
from lowband.comm import BOOKKEEPING_TAGS, Communicator
from lowband.comm.placement import here, local_rank, local_world
from lowband.comm.sites import configured, describe
from lowband.config import Config, to_dict
from lowband.data import Batches, TensorData, load_dataset, partition, steps_per_epoch
from lowband.data.metric import metric_for
from lowband.errors import Diverged
from lowband.methods.base import Context, Method
from lowband.models import build_for_task
from lowband.records import EpochRecord, Scores
from lowband.registry import METHODS
from lowband.registry.catalog import load_all
from lowband.run import checkpoint
from lowband.run.metrics import setup_logging
from lowband.run.reporter import EpochReporter, RankFigures, TrainingError, set_corpus, tag_bytes, target_of
from lowband.run.rundir import RunDir
from lowband.run.schedule import MethodSchedule

__all__ = ["Trainer", "TrainingError", "train_step", "checked_step", "worker_data", "rank_batches", "accuracy", "scores",
           "model_scores", "model_metadata", "task_loss", "due"]


@dataclass
class WorkerData:
    """What every rank derives from the config alone: the data set, each rank's shard, steps per epoch."""

    data: TensorData
    shards: list[torch.Tensor]
    steps: int


def worker_data(cfg: Config, world: int) -> WorkerData:
    load_all()
    data = load_dataset(cfg.data)
    shards = METHODS.get(cfg.method.name).partition(cfg.method, data.y_train, world, cfg.train.seed)
    if shards is None:
        shards = partition(data.y_train, world, cfg.data.partition, cfg.train.seed, cfg.data.alpha)
    return WorkerData(data, shards, steps_per_epoch(shards, cfg.train.batch_size))


def rank_batches(cfg: Config, plan: WorkerData, rank: int, device: torch.device) -> Batches:
    """Rank `rank`'s minibatches: its shard, shuffled each epoch by a seed of its own."""
    return Batches(plan.data, plan.shards[rank], cfg.train.batch_size, plan.steps, seed=cfg.train.seed * 131 + rank,
                   augment=wants_augment(cfg, plan.data), device=device)


def due(epoch: int, every: int, epochs: int) -> bool:
    """Whether epoch `epoch` of `epochs` is evaluated (train.eval_every) or checkpointed
    (train.checkpoint_every, 0: only the last): every `every`-th epoch and the last, in every kind of run."""
    return epoch == epochs or bool(every and epoch % every == 0)


def resolve_device(requested: str) -> torch.device:
    """The device this process trains on for train.device=`requested` (lowband.comm.placement's rule:
    local rank r on GPU r % the GPUs); ConfigError when it asks for CUDA and there is none."""
    return here(requested, "auto", local_world()).device_of(local_rank())


def make_optimizer(cfg, params):
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
                           weight_decay=cfg.weight_decay)


def task_loss(outputs: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits (batch, classes) against labels (batch,), or of a language model's
    logits (batch, positions, vocabulary) against next tokens (batch, positions), over every position."""
    return F.cross_entropy(outputs.flatten(0, -2), y.flatten(), reduction=reduction)


def train_step(model: torch.nn.Module, method: Method, optimizer, batch, step: int) -> float:
    """One optimizer step with the method's hooks in their fixed order; returns the minibatch loss."""
    outputs = model(batch.x)
    loss = method.loss(batch, outputs, task_loss(outputs, batch.y))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    method.after_backward(step)
    optimizer.step()
    method.after_step(step)
    return loss.item()


def checked_step(model: torch.nn.Module, method: Method, optimizer, batch, step: int, epoch: int,
                 worker: int) -> float:
    """`train_step`, stopping on a non-finite loss: this worker alone knows, so it raises Diverged (with
    the 1-based `epoch` and the step's number) and the launcher stops the others."""
    loss = train_step(model, method, optimizer, batch, step)
    if not math.isfinite(loss):
        raise Diverged(epoch, step + 1, worker, loss, optimizer.param_groups[0]["lr"])
    return loss


@torch.no_grad()
def scores(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, device) -> tuple[float, float]:
    """(accuracy, mean cross-entropy in nats) of `model` on (x, y), over every sample (a language
    model: every position of every window)."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0.0, 0.0
    for i in range(0, len(x), batch):
        outputs, target = model(x[i:i + batch].to(device)), y[i:i + batch].to(device)
        correct += (outputs.argmax(-1) == target).sum().item()
        loss_sum += task_loss(outputs, target, reduction="sum").item()
    model.train(was_training)
    count = max(y.numel(), 1)
    return correct / count, loss_sum / count


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, device) -> float:
    return scores(model, x, y, batch, device)[0]


def model_scores(model: torch.nn.Module, data: TensorData, batch: int, device) -> Scores:
    """`model`'s test and validation scores (validation None without a validation split)."""
    test_acc, test_loss = scores(model, data.x_test, data.y_test, batch, device)
    val_acc, val_loss = (scores(model, data.x_val, data.y_val, batch, device)
                         if data.x_val is not None and data.y_val is not None else (None, None))
    return Scores(test_acc, val_acc, test_loss, val_loss)


def model_metadata(cfg: Config, data: TensorData) -> dict[str, str]:
    """What a reader needs to rebuild the model without the data set: written into model.safetensors."""
    return {"lowband_version": __version__, "method": cfg.method.name,
            "model": json.dumps(asdict(cfg.model)), "in_shape": json.dumps(list(data.in_shape)),
            "num_classes": str(data.num_classes)}


class Trainer:
    """Runs one rank's training: epochs of `train_step`, evaluation, checkpoints, the final model."""

    def __init__(self, cfg: Config, comm: Communicator, run_dir: str):
        self.cfg, self.comm = cfg, comm
        self.rank, self.world = comm.rank, comm.world
        self.run = RunDir(run_dir, self.rank)
        self.log = setup_logging(run_dir, self.rank)
        self.device = comm.device
        self.plan = worker_data(cfg, self.world)
        method_cls = METHODS.get(cfg.method.name)
        torch.manual_seed(cfg.train.seed if method_cls.same_init else cfg.train.seed + 7919 * self.rank)
        data = self.plan.data
        model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task).to(self.device)
        self.optimizer = make_optimizer(cfg.optim, model.parameters())
        ctx = Context(cfg, comm, self.device, self.log, self.run, self.plan.steps, self.plan.data,
                      self.plan.shards[self.rank], evaluate=self._evaluate)
        self.method: Method = method_cls(cfg.method, ctx)
        self.model = self.method.setup(model)
        self.batches = rank_batches(cfg, self.plan, self.rank, self.device)
        self.schedule = MethodSchedule(cfg, self.method)
        # ranks that train one model together report together; separate models report alone
        self.scope = comm.alone() if method_cls.independent_models else comm
        self.metric = metric_for(cfg.data.name)
        self.reporter = EpochReporter(self.scope, self.run, self.log, cfg.train.epochs, cfg.train.loggers,
                                      to_dict(cfg), self.metric)
        self.reached_target: int | None = None
        self.final_global: torch.nn.Module | None = None  # the global model of the latest evaluated epoch
        self.best_local_rank = 0
        self.epoch, self.step, self.samples, self.elapsed, self.train_s = 0, 0, 0, 0.0, 0.0
        self.method_eval_s = 0.0  # evaluations a method asked for inside training hooks

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> None:
        try:
            self._fit(resume)
        except Diverged as e:
            self.run.record_divergence(f"{e}\n\n{traceback.format_exc()}")
            raise

    def _fit(self, resume: bool) -> None:
        if resume:
            self._resume()
        if self.epoch == 0 and self.rank == 0:
            self.log.info(self._banner())
        for epoch in range(self.epoch + 1, self.cfg.train.epochs + 1):
            self._run_epoch(epoch)
            if self._should_stop():
                self.log.info(f"stopping at epoch {epoch}: validation {self.metric.name} reached {self._target():.4f}")
                break
        self.method.end_training()
        self._save_final()

    def train_step(self, batch) -> float:
        loss = checked_step(self.model, self.method, self.optimizer, batch, self.step, self.epoch + 1, self.rank)
        self.step += 1
        return loss

    def _should_stop(self) -> bool:
        if not self.cfg.train.stop_at_target:
            return False
        flag = torch.tensor([1.0 if self.reached_target is not None else 0.0], device=self.device)
        self.scope.broadcast(flag, src=0, tag="control")  # the scope follows its first rank's model
        return bool(flag.item())

    def _run_epoch(self, epoch: int) -> None:
        t_start, comm_before, eval_before = time.perf_counter(), self._comm_seconds(), self.method_eval_s
        loss_sum, data_wait = 0.0, 0.0
        batches = iter(self.method.batches(epoch, self.batches))
        for i in self.reporter.sink.steps(range(self.plan.steps), epoch, self.plan.steps):
            t0 = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - t0
            self._set_lr(epoch - 1 + i / self.plan.steps)
            loss_sum += self.train_step(batch)
        hook_eval_s = self.method_eval_s - eval_before
        train_s = time.perf_counter() - t_start - hook_eval_s
        comm_s = self._comm_seconds() - comm_before
        extra = self.method.end_epoch(epoch)
        self.epoch, self.samples = epoch, self.samples + self.plan.steps * self.cfg.train.batch_size
        self.train_s += train_s
        # wait_s: time the loop waited for its next minibatch (data loading, a starving EDL-Dist reader)
        times = {"compute_s": max(train_s - comm_s - data_wait, 0.0), "comm_s": comm_s, "wait_s": data_wait,
                 "hook_eval_s": hook_eval_s, "epoch_train_s": train_s}
        self._finish_epoch(epoch, loss_sum / self.plan.steps, times, t_start, extra)

    def _set_lr(self, epoch: float) -> None:
        self.schedule.apply(self.optimizer, epoch)

    def close(self) -> None:
        try:
            self.method.close()
        finally:
            self.reporter.close()

    # ---- evaluation and records ----------------------------------------------------------------
    def _comm_seconds(self) -> float:
        return self.comm.ledger.seconds(leave_out=BOOKKEEPING_TAGS)

    def _accuracies(self, model: torch.nn.Module) -> Scores:
        return model_scores(model, self.plan.data, self.cfg.train.eval_batch_size, self.device)

    def _evaluate(self, model: torch.nn.Module) -> float:
        """Validation accuracy of a model a method asks about (rounds, ensembles); timed as evaluation."""
        t0 = time.perf_counter()
        d = self.plan.data
        x, y = (d.x_val, d.y_val) if d.x_val is not None and d.y_val is not None else (d.x_test, d.y_test)
        acc = accuracy(model, x, y, self.cfg.train.eval_batch_size, self.device)
        self.method_eval_s += time.perf_counter() - t0
        return acc

    def _finish_epoch(self, epoch: int, loss: float, times: dict, t_start: float, extra: dict) -> None:
        t_eval = time.perf_counter()
        last = epoch == self.cfg.train.epochs
        evaluate = due(epoch, self.cfg.train.eval_every, self.cfg.train.epochs)
        mine = RankFigures(loss=loss, samples=self.plan.steps * self.cfg.train.batch_size, seen=self.samples)
        glob, glob_accs = None, None
        if evaluate:
            local = self._accuracies(self.method.local_model())
            mine.test_acc, mine.val_acc, mine.test_loss, mine.val_loss = (
                local.test_acc, local.val_acc, local.test_loss, local.val_loss)
            glob = self.method.global_model(final=last)
            glob_accs = self._accuracies(glob) if glob is not None and self.scope.rank == 0 else None
        times["eval_s"] = time.perf_counter() - t_eval
        mine.bytes = tag_bytes(self.comm)  # after the global model, whose final exchange counts
        ranks = self.reporter.gather(mine)
        self.elapsed += time.perf_counter() - t_start
        self.best_local_rank = self.scope.global_ranks[self.reporter.best_local(ranks)]
        record = self.reporter.record(epoch, ranks, glob_accs)
        record.steps = self.step
        self._add_rates(record, ranks, times)
        set_corpus(record, self.plan.data.meta)
        self._check_target(epoch, record)
        record.reached_target_epoch, record.extra = self.reached_target, extra
        self.reporter.write(record)
        if due(epoch, self.cfg.train.checkpoint_every, self.cfg.train.epochs):
            self._save_checkpoint(epoch)
        if evaluate:  # the stopping epoch of an early stop is always evaluated
            self.final_global = glob

    def _add_rates(self, record: EpochRecord, ranks: list[RankFigures], times: dict) -> None:
        samples = sum(r.samples for r in ranks)
        record.samples_per_s = round(samples / max(times["epoch_train_s"], 1e-9), 2)
        record.lr = self.optimizer.param_groups[0]["lr"]
        record.time = {**{k: round(v, 4) for k, v in times.items()}, "train_s": round(self.train_s, 4),
                       "elapsed_s": round(self.elapsed, 4)}

    def _target(self) -> float:
        """train.target_accuracy, or train.target_bpb for a language model (0: none)."""
        return target_of(self.cfg.train, self.metric)

    def _check_target(self, epoch: int, record: EpochRecord) -> None:
        """The first epoch whose validation figure reaches the target in the workload's metric (never the test set)."""
        target, value = self._target(), record.value(self.metric.val_key)
        if target and self.reached_target is None and self.metric.reaches(value, target):
            self.reached_target = epoch
            self.log.info(f"epoch {epoch}: validation {self.metric.name} {value:.4f} reached the target {target}")

    def _save_final(self) -> None:
        """The scope's final model (the global one if the method has one, else this rank's); model_L too."""
        glob = self.final_global
        if self.scope.rank == 0:
            final = glob if glob is not None else self.method.local_model()
            checkpoint.save_model(final.state_dict(), self.run.model_path(self.rank), self._model_metadata())
        if glob is not None and self.rank == self.best_local_rank:
            checkpoint.save_model(self.method.local_model().state_dict(), self.run.local_model_path(),
                                  self._model_metadata())

    def _model_metadata(self) -> dict[str, str]:
        return model_metadata(self.cfg, self.plan.data)

    # ---- checkpoints ---------------------------------------------------------------------------
    def _save_checkpoint(self, epoch: int) -> None:
        state = {
            "epoch": epoch, "step": self.step, "samples": self.samples, "elapsed": self.elapsed,
            "model": self.method.local_model().state_dict(), "reached_target": self.reached_target or 0,
            "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(),
            "comm": self.comm.ledger.snapshot(), "rng": torch.get_rng_state(), "train_s": self.train_s,
        }
        checkpoint.save_state(state, checkpoint.rank_path(self.run.path, self.rank, epoch))
        checkpoint.prune(self.run.path, self.rank)

    def _resume(self) -> None:
        epoch, passed = checkpoint.resumable_epoch(self.run.path, self.scope.global_ranks)
        if passed and self.scope.rank == 0:
            self.log.warning(f"resuming from epoch {epoch}, the newest intact epoch every rank has: "
                             f"{'; '.join(passed)}")
        agreed = self.scope.all_gather(torch.tensor([epoch], device=self.device), tag="control")
        if len({int(t.item()) for t in agreed}) != 1:
            raise TrainingError(f"ranks see different checkpoints ({[int(t) for t in agreed]}); is the run dir shared?")
        self.run.cut_back(epoch)  # records past the checkpoint would be written twice
        if epoch == 0:
            self.log.warning(f"no checkpoint in {self.run.path}; starting from scratch")
            return
        state = checkpoint.load_state(checkpoint.rank_path(self.run.path, self.rank, epoch))
        self.method.local_model().load_state_dict(state["model"])
        self.reached_target = state.get("reached_target") or None
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        self.comm.ledger.load_snapshot(state["comm"])
        torch.set_rng_state(state["rng"])
        self.epoch, self.step, self.samples, self.elapsed = state["epoch"], state["step"], state["samples"], state["elapsed"]
        self.train_s = state.get("train_s", 0.0)
        self.log.info(f"resumed {self.run.path} after epoch {epoch} (step {self.step})")

    def _banner(self) -> str:
        c, d = self.cfg, self.plan.data
        params = sum(p.numel() for p in self.method.local_model().parameters())
        val = 0 if d.y_val is None else len(d.y_val)
        return (f"{c.method.name}: {self.world} worker(s), backend {self.comm.backend}, device {self.device}; "
                f"{c.data.name} {len(d.y_train)} train / {val} validation / {len(d.y_test)} test"
                f"{self._corpus_banner()}, partition "
                f"{c.data.partition}; {c.model.name} {params:,} parameters; {self.plan.steps} steps/epoch x "
                f"{c.train.epochs} epochs, batch {c.train.batch_size}/worker; run dir {self.run.path}"
                + self._sites_banner())

    def _corpus_banner(self) -> str:
        meta = self.plan.data.meta
        return f" windows of {meta['corpus_bytes']:,} bytes (sha256 {meta['corpus_sha256'][:12]})" if meta else ""

    def _sites_banner(self) -> str:
        link = self.cfg.link
        return f"; {describe(link.site_map(self.world))}" if configured(link.sites, link.site_of) else ""


def wants_augment(cfg: Config, data) -> bool:
    """Random crop and flip: on when asked, or by default for image data sets read from disk."""
    return cfg.data.augment == "on" or (cfg.data.augment == "auto" and len(data.in_shape) == 3
                                        and cfg.data.name in ("cifar10", "cifar100", "imagefolder"))
