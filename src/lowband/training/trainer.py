"""The one training loop, of `lowband train` and of an elastic job. It calls the method's hooks and never
asks which method it runs, nor who it trains with.

`train_step` is one optimizer step with the hooks in their fixed order (tests drive methods with
it too); `Trainer` runs the epochs: the steps its `Team` feeds it, each at the rate schedule.py gives
its place, then the epoch's record (the team's figures, completed here and written through the
metrics sink), on the epochs `due` names evaluated and checkpointed, and at the end the final model.

The `Team` is who trains together: `FixedRanks` (training/ranks.py) for `lowband train`'s ranks, an
elastic job's `ElasticWorker` (training/elastic/worker.py). It feeds the data and writes the records,
checkpoints and final model; its worker's `Seat` names a `quorum` (comm/quorum.py): who takes the method's outer steps, which
the method consults from its own hooks (torchft's Manager in our shape), so one method object trains
either membership.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F

from lowband import __version__
from lowband.catalog import load_all
from lowband.comm import Communicator
from lowband.comm.placement import here, local_rank, local_world
from lowband.comm.quorum import Quorum
from lowband.config import Config
from lowband.data import Batch, Batches, TensorData, load_dataset, partition, steps_per_epoch
from lowband.data.metric import metric_for
from lowband.errors import Diverged
from lowband.methods.base import Context, Method
from lowband.models import build_for_task
from lowband.records import EpochRecord, Scores
from lowband.registry import METHODS
from lowband.run.reporter import TrainingError, first_reached, set_corpus, target_of
from lowband.run.rundir import RunDir
from lowband.run.schedule import MethodSchedule

__all__ = ["Trainer", "Team", "Seat", "Made", "Steps", "Resumed", "TrainingError",
           "train_step", "checked_step", "worker_data", "rank_batches", "accuracy", "scores",
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


def autocast(device: torch.device, precision: str):
    """The forward pass's context for train.precision: bf16 is torch.autocast in bfloat16 on the device's type
    (the weights stay fp32); fp32 is no context at all."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def train_step(model: torch.nn.Module, method: Method, optimizer, batch, step: int,
               counted: Callable[[float], None] | None = None, precision: str = "fp32") -> float:
    """One optimizer step with the method's hooks in their fixed order; returns the minibatch loss. `counted`
    hears the loss before `after_step`, whose outer step may report what was trained (an elastic round).
    `precision` bf16: the forward pass under autocast, the loss taken in fp32."""
    with autocast(batch.x.device, precision):
        outputs = model(batch.x)
    outputs = outputs.float()
    loss = method.loss(batch, outputs, task_loss(outputs, batch.y))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    method.after_backward(step)
    optimizer.step()
    value = loss.item()
    if counted is not None:
        counted(value)
    method.after_step(step)
    return value


def checked_step(model: torch.nn.Module, method: Method, optimizer, batch, step: int, epoch: int,
                 worker: int, counted: Callable[[float], None] | None = None, precision: str = "fp32") -> float:
    """`train_step`, stopping on a non-finite loss: this worker alone knows, so it raises Diverged (with
    the 1-based `epoch` and the step's number) and the launcher stops the others."""
    loss = train_step(model, method, optimizer, batch, step, counted, precision)
    if not math.isfinite(loss):
        raise Diverged(epoch, step + 1, worker, loss, optimizer.param_groups[0]["lr"], method.divergence_suspects())
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


#: up to this many workers on one machine evaluate with train.eval_batch_size itself
EVAL_SHARE_FROM = 8


def eval_batch(requested: int, workers_here: int) -> int:
    """The evaluation batch of a worker among `workers_here` on its machine: train.eval_batch_size, cut in
    proportion beyond EVAL_SHARE_FROM workers. All evaluate at once, and each batch's activations are a worker's
    largest allocation (about 300 MB at 1,000 windows of the GPT's): 64 workers ran a 24 GB machine out of
    memory. The figures are the same up to the order of a float sum."""
    return requested if workers_here <= EVAL_SHARE_FROM else max(1, requested * EVAL_SHARE_FROM // workers_here)


def model_metadata(cfg: Config, data: TensorData) -> dict[str, str]:
    """What a reader needs to rebuild the model without the data set: written into model.safetensors."""
    return {"lowband_version": __version__, "method": cfg.method.name,
            "model": json.dumps(asdict(cfg.model)), "in_shape": json.dumps(list(data.in_shape)),
            "num_classes": str(data.num_classes)}


@dataclass
class Seat:
    """Where a worker trains once it has joined its team: what the trainer and the method's context consult."""

    rank: int  # this process's rank, or the elastic worker's id
    comm: Communicator  # the communicator the method's context names (an elastic worker: itself alone)
    device: torch.device
    log: logging.Logger
    quorum: Callable[[Communicator], Quorum]  # who takes the method's outer steps over a communicator
    shard: torch.Tensor | None  # this worker's shard of the data plan (None: its data come round by round)
    sync_seconds: Callable[[], float]  # seconds spent synchronising since the run began


@dataclass
class Made:
    """An epoch's record as the team made it, for the trainer to complete."""

    record: EpochRecord
    samples: int  # trained in the epoch by every worker
    earlier: list[EpochRecord] = field(default_factory=list)  # the run's records other workers wrote (elastic)


class Team(Protocol):
    """Who trains together, as the trainer consults it: what truly differs between memberships. The data
    each worker trains, who writes the epoch's record, checkpoint and final model. It never steps the
    model nor sets the trainer's counters.

    `FixedRanks` (training/ranks.py) is `lowband train`'s: the same ranks every epoch, each its shard. An
    elastic job's is `ElasticWorker` (training/elastic/worker.py): the slices of the epoch's order that each
    round of its quorum hands out. Who takes part in the method's outer steps is the seat's `quorum`
    (comm/quorum.py), which the method consults (torchft's Manager in our shape); the method, its hooks
    and its state are the trainer's, one object for every membership."""

    width: int  # the workers the data plan is cut for

    def join(self, trainer: Trainer) -> Seat:
        """Once the trainer has its data plan, before the model and method are built: this worker's seat (an
        elastic worker registers with its job here)."""

    def start(self, trainer: Trainer, resume: bool) -> Resumed | None:
        """Before the first epoch: with `resume`, the state a checkpoint holds loaded into the model,
        optimizer and method, and the trainer's counters to take (None: from the start)."""

    def epochs(self, trainer: Trainer) -> Iterator[tuple[int, Iterator[tuple[Batch, float]]]]:
        """The epochs (1-based) this worker trains, in order, each with its minibatches and their places in
        the run (epochs trained, a fraction). The trainer takes a step on each batch before it asks for the
        next, and ends the epoch before it asks for the next epoch; the epochs end early where
        train.stop_at_target says so, the same on every worker."""

    def record(self, trainer: Trainer, epoch: int, done: Steps, evaluate: bool) -> Made | None:
        """The epoch's figures as a record (None: another worker writes this epoch's record); the global
        model evaluated when `evaluate`."""

    def keep(self, trainer: Trainer, epoch: int, record: EpochRecord | None, checkpoint: bool) -> None:
        """What the epoch leaves: its completed record written (to metrics.jsonl, the experiment loggers
        and the console) and, when `checkpoint`, the state a resume after it starts from."""

    def finish(self, trainer: Trainer) -> None:
        """After the last epoch: the final model."""

    def close(self, trainer: Trainer) -> None:
        """Release what the team holds (loggers, its place in a job)."""


@dataclass
class Resumed:
    """The trainer's counters as a checkpoint holds them."""

    epoch: int
    step: int
    elapsed: float = 0.0
    train_s: float = 0.0
    reached_target: int | None = None


@dataclass
class Steps:
    """One epoch's steps on this worker: how many, their losses' sum, seconds spent waiting for batches."""

    taken: int = 0
    loss_sum: float = 0.0
    wait_s: float = 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.taken, 1)


class Trainer:
    """The one training loop, of `lowband train`'s ranks and an elastic job's workers alike: epochs of
    `checked_step` over the batches its `Team` feeds, each step at the rate schedule.py gives its place
    in the run; at each epoch's end the team's record, completed here (steps, rate, seconds, corpus,
    target) and written through the metrics sink, on the epochs `due` names evaluated and
    checkpointed; at the end the team's final model."""

    def __init__(self, cfg: Config, team: Team, run_dir: str):
        self.cfg, self.team = cfg, team
        self.plan = worker_data(cfg, team.width)
        self.metric = metric_for(cfg.data.name)
        self.reached_target: int | None = None
        self.epoch, self.step, self.loss_total, self.elapsed, self.train_s = 0, 0, 0.0, 0.0, 0.0
        self.method_eval_s = 0.0  # evaluations a method asked for inside training hooks
        self.eval_s = 0.0  # evaluations at the epochs' ends (`scores`)
        self.seat = seat = team.join(self)  # an elastic worker registers with its job here
        self.log, self.rank, self.device = seat.log, seat.rank, seat.device
        method_cls = METHODS.get(cfg.method.name)
        torch.manual_seed(cfg.train.seed if method_cls.same_init else cfg.train.seed + 7919 * seat.rank)
        data = self.plan.data
        model = build_for_task(cfg.model, data.in_shape, data.num_classes, data.task).to(self.device)
        self.optimizer = make_optimizer(cfg.optim, model.parameters())
        self.params = sum(p.numel() for p in model.parameters())  # one copy's, before a method wraps it
        ctx = Context(cfg, seat.comm, self.device, self.log, RunDir(run_dir, seat.comm.rank), self.plan.steps,
                      data, seat.shard, evaluate=self._evaluate, quorum=seat.quorum, width=team.width)
        self.method: Method = method_cls(cfg.method, ctx)  # one method object, whoever trains together
        self.model = self.method.setup(model)
        self.schedule = MethodSchedule(cfg, self.method)
        self.run = RunDir(run_dir, self.rank)

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> None:
        try:
            self._fit(resume)
        except Diverged as e:
            self.run.record_divergence(f"{e}\n\n{traceback.format_exc()}")
            raise

    def _fit(self, resume: bool) -> None:
        resumed = self.team.start(self, resume)
        if resumed is not None:
            self.epoch, self.step, self.elapsed = resumed.epoch, resumed.step, resumed.elapsed
            self.train_s, self.reached_target = resumed.train_s, resumed.reached_target
        for epoch, feed in self.team.epochs(self):
            self._run_epoch(epoch, feed)
        self.method.end_training()
        self.team.finish(self)

    def _run_epoch(self, epoch: int, feed: Iterable[tuple[Batch, float]]) -> None:
        t_start, eval_before, comm_before = time.perf_counter(), self.method_eval_s, self.seat.sync_seconds()
        done = self._steps(feed, epoch)
        hook_eval_s = self.method_eval_s - eval_before
        train_s = time.perf_counter() - t_start - hook_eval_s
        comm_s = self.seat.sync_seconds() - comm_before
        self.epoch, self.train_s = epoch, self.train_s + train_s
        # wait_s: time the loop waited for its next minibatch (data loading, a starving EDL-Dist reader)
        times = {"compute_s": max(train_s - comm_s - done.wait_s, 0.0), "comm_s": comm_s, "wait_s": done.wait_s,
                 "hook_eval_s": hook_eval_s, "epoch_train_s": train_s}
        self._finish_epoch(epoch, done, times, t_start)

    def _steps(self, feed: Iterable[tuple[Batch, float]], epoch: int) -> Steps:
        """`checked_step` on each minibatch `feed` yields, at the rate of its place (epochs trained, a
        fraction: 1.5 is halfway through the second); `step` and `loss_total` count each step before the
        method's `after_step` (an elastic worker's round, inside it, reports them). Waiting for a batch
        leaves out the synchronising the feed did meanwhile (an elastic job's meetings between slices,
        a modelled link's hold on EDL-Dist's soft labels), which is communication."""
        done, batches = Steps(), iter(feed)

        def count(loss: float) -> None:
            self.step, self.loss_total = self.step + 1, self.loss_total + loss
            done.taken, done.loss_sum = done.taken + 1, done.loss_sum + loss

        while True:
            t0, synced = time.perf_counter(), self.seat.sync_seconds()
            item = next(batches, None)
            done.wait_s += max(time.perf_counter() - t0 - (self.seat.sync_seconds() - synced), 0.0)
            if item is None:
                return done
            batch, place = item
            self.schedule.apply(self.optimizer, place)
            checked_step(self.model, self.method, self.optimizer, batch, self.step, epoch, self.rank, count,
                         self.cfg.train.precision)

    def close(self) -> None:
        """The method's `close`, then the team's (its loggers, its place in a job)."""
        try:
            self.method.close()
        finally:
            self.team.close(self)

    # ---- evaluation and records ----------------------------------------------------------------
    def scores(self, model: torch.nn.Module) -> Scores:
        """`model`'s test and validation scores on this run's data; timed as the epoch's evaluation."""
        t0 = time.perf_counter()
        found = model_scores(model, self.plan.data, eval_batch(self.cfg.train.eval_batch_size, local_world()),
                             self.device)
        self.eval_s += time.perf_counter() - t0
        return found

    def _evaluate(self, model: torch.nn.Module) -> float:
        """Validation accuracy of a model a method asks about (rounds, ensembles); timed as evaluation."""
        t0 = time.perf_counter()
        d = self.plan.data
        x, y = (d.x_val, d.y_val) if d.x_val is not None and d.y_val is not None else (d.x_test, d.y_test)
        acc = accuracy(model, x, y, eval_batch(self.cfg.train.eval_batch_size, local_world()), self.device)
        self.method_eval_s += time.perf_counter() - t0
        return acc

    def _finish_epoch(self, epoch: int, done: Steps, times: dict, t_start: float) -> None:
        """The team's record of the epoch (None: another worker writes it), completed here and kept by the
        team with the checkpoint on the epochs train.checkpoint_every names."""
        eval_before = self.eval_s
        extra = self.method.end_epoch(epoch)  # on every worker, whoever writes the record
        made = self.team.record(self, epoch, done, due(epoch, self.cfg.train.eval_every, self.cfg.train.epochs))
        times["eval_s"] = self.eval_s - eval_before
        self.elapsed += time.perf_counter() - t_start
        record = None
        if made is not None:
            record = made.record
            record.extra = {**extra, **(record.extra or {})}
            record.steps, record.params = self.step, self.params
            self._add_rates(record, made.samples, times)
            set_corpus(record, self.plan.data.meta)
            self._check_target(epoch, record, made.earlier)
            record.reached_target_epoch = self.reached_target
        self.team.keep(self, epoch, record, due(epoch, self.cfg.train.checkpoint_every, self.cfg.train.epochs))

    def _add_rates(self, record: EpochRecord, samples: int, times: dict) -> None:
        """`samples`: trained this epoch by every worker."""
        record.samples_per_s = round(samples / max(times["epoch_train_s"], 1e-9), 2)
        record.lr = self.optimizer.param_groups[0]["lr"]
        record.time = {**{k: round(v, 6) for k, v in times.items()}, "train_s": round(self.train_s, 6),
                       "elapsed_s": round(self.elapsed, 6)}

    def target(self) -> float:
        """train.target_accuracy, or train.target_bpb for a language model (0: none)."""
        return target_of(self.cfg.train, self.metric)

    def _check_target(self, epoch: int, record: EpochRecord, earlier: list[EpochRecord]) -> None:
        """The first epoch whose validation figure reaches the target in the workload's metric (never the test
        set), among `earlier` (other workers' records) and this one."""
        found = first_reached([*earlier, record], self.metric, self.target())
        if self.reached_target is None and found is not None:
            self.reached_target = found
            self.log.info(f"epoch {epoch}: validation {self.metric.name} {record.value(self.metric.val_key):.4f} "
                          f"reached the target {self.target()}")

    def model_metadata(self) -> dict[str, str]:
        return model_metadata(self.cfg, self.plan.data)


def wants_augment(cfg: Config, data) -> bool:
    """Random crop and flip: on when asked, or by default for image data sets read from disk."""
    return cfg.data.augment == "on" or (cfg.data.augment == "auto" and len(data.in_shape) == 3
                                        and cfg.data.name in ("cifar10", "cifar100", "imagefolder"))
