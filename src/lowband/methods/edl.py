"""EDL-Dist: elastic knowledge distillation with remote teacher servers.

Dong et al., "Elastic Deep Learning using Knowledge Distillation with Heterogeneous Computing
Resources" (2021). K student ranks train a small model with allreduce (DDP) on the loss
alpha * CE(y, student) + beta * T^2 * KL(softmax(teacher / T) || softmax(student / T)). The teacher's
logits come from teacher servers (`lowband teacher`) registered in a Redis Coordinator; each rank's
DistilReader streams its minibatches to the teachers it was assigned, prefetches their answers
into a bounded buffer, asks for more teachers while starving and re-sends the batches of a teacher
that died. The same method runs the paper's two baselines, so all three share one code path:
  mode = edl     teachers on other processes or machines (the paper's system)
  mode = online  the teacher in the student's own process, its forward pass before every step
  mode = ntrain  the student alone on the hard labels ("N-training")
The mode only picks the teacher source (distill/sources.py); the rest of the method is shared.
"""

from __future__ import annotations

import copy
import os
import socket
import time
from dataclasses import dataclass
from typing import Literal

import torch

from lowband.comm import launched_by_torchrun
from lowband.config import MAX_THREADS, MAX_TIMEOUT_S, check_threads, opt
from lowband.distill.losses import kd_loss
from lowband.distill.sources import InProcessTeacher, NoTeacher, RemoteTeachers, TeacherSource
from lowband.distill.teacher import token_from_env
from lowband.errors import UsageError, require
from lowband.methods.allreduce import Allreduce, AllreduceConfig
from lowband.registry import METHODS


@dataclass(kw_only=True)
class EDLConfig(AllreduceConfig):
    name: str = opt("edl", "training method")
    mode: Literal["edl", "online", "ntrain"] = opt(
        "edl", "edl: remote teacher servers; online: teacher in the student process; ntrain: no teacher")
    teacher: str = opt("", "teacher checkpoint: a lowband run dir, its model.safetensors or a checkpoints/*.pt")
    coordinator: str = opt("", "Redis URL of the Coordinator, e.g. redis://host:6379/0 (empty: an embedded one)")
    local_teachers: int = opt(0, "start this many teacher processes on this machine for the run", bounds="0..64")
    teacher_threads: int = opt(1, "torch threads of each local teacher", bounds=f"1..{MAX_THREADS}")
    teacher_max_rate: float = opt(0.0, "cap each local teacher's samples/s (emulates slower devices; 0: no cap)", bounds=">= 0")
    alpha: float = opt(0.5, "weight of the hard-label cross-entropy", bounds=">= 0")
    beta: float = opt(0.5, "weight of the distillation term T^2 * KL", bounds=">= 0")
    temperature: float = opt(2.0, "softmax temperature T of the distillation term (T = 4 with the default lr "
                                  "was unstable on MNIST-1D: the soft term's gradient grows with T)", bounds="> 0")
    teachers: int = opt(0, "teachers per student rank at start; 0: from measured student/teacher throughputs",
                         bounds="0..1024")
    max_teachers: int = opt(8, "most teachers one student rank holds", bounds="1..1024")
    ut: int = opt(32, "upper threshold: stop sending batches to teachers above this many unused soft labels",
                   bounds="1..1000000")
    lt: int = opt(8, "lower threshold: resume sending below this many unused soft labels", bounds="0..1000000")
    depth: int = opt(2, "requests in flight per teacher connection", bounds="1..64")
    request_batches: int = opt(4, "minibatches per request to a teacher (fewer, larger frames)", bounds="1..1024")
    teacher_timeout_s: float = opt(300.0, "with no teacher at all, wait this long (saying so), then fail",
                                      bounds=f"(0, {MAX_TIMEOUT_S:g}]")
    request_timeout_s: float = opt(30.0, "a teacher that does not answer a batch within this is considered dead",
                                      bounds=f"(0, {MAX_TIMEOUT_S:g}]")
    lease_s: float = opt(5.0, "a dead student's teachers become free after this",
                            bounds=f"(0, {MAX_TIMEOUT_S:g}]")
    log_samples: bool = opt(False, "write the sample ids each rank trained on to samples.rank{R}.jsonl")

    def __post_init__(self):
        super().__post_init__()
        require(0 <= self.lt < self.ut, "method.lt", self.lt, f"must be >= 0 and below method.ut = {self.ut}")
        require(0 <= self.teachers <= self.max_teachers, "method.teachers", self.teachers,
                f"must be in [0, method.max_teachers = {self.max_teachers}]")


@METHODS.register("edl")
class EDL(Allreduce):
    Config = EDLConfig
    cfg: EDLConfig
    around_the_step = False  # its loss is the teacher's, served beside the workers

    @classmethod
    def check(cls, cfg: EDLConfig, world: int) -> None:
        if cfg.mode != "ntrain":
            require(bool(cfg.teacher), "method.teacher", cfg.teacher, f"mode {cfg.mode} needs a teacher checkpoint")
        if cfg.mode == "edl" and launched_by_torchrun():
            require(bool(cfg.coordinator), "method.coordinator", cfg.coordinator,
                    "under torchrun, start teachers with `lowband teacher` and give their Redis URL")
            require(cfg.local_teachers == 0, "method.local_teachers", cfg.local_teachers,
                    "needs lowband's own launcher; under torchrun start teachers with `lowband teacher`")
        if cfg.local_teachers:
            check_threads(cfg.teacher_threads, "method.teacher_threads")

    @classmethod
    def services(cls, cfg: EDLConfig):
        from lowband.distill.services import edl_services  # redis: loaded by EDL-Dist runs alone

        return edl_services(cfg)

    def setup(self, model):
        self.timeline = self.ctx.run.stream("distill", per_rank=True)
        self.samples_log = self.ctx.run.stream("samples", per_rank=True)
        self.source = self._make_source(model)
        return super().setup(model)

    def _make_source(self, model) -> TeacherSource:
        """The teacher source `method.mode` names (distill/sources.py)."""
        if self.cfg.mode == "ntrain":
            return NoTeacher()
        if self.cfg.mode == "online":
            return InProcessTeacher(self._load_teacher().to(self.ctx.device))
        reader = self._make_reader(student_rate(model, self.ctx))
        return RemoteTeachers(reader, self.ctx.comm, self.ctx.steps_per_epoch, self.ctx.cfg.train.epochs, self.ctx.device)

    def _load_teacher(self):
        from lowband.distill.serve import load_teacher  # redis: loaded by EDL-Dist runs alone

        model, _, in_shape, classes = load_teacher(self.cfg.teacher)
        check_fits(self.ctx.data, in_shape, classes, self.cfg.teacher)
        return model

    def _make_reader(self, rate: float):
        # redis: loaded by EDL-Dist runs alone (every run imports every method)
        from lowband.distill.coordinator import Coordinator
        from lowband.distill.reader import DistilReader, ReaderConfig
        from lowband.distill.services import ENV

        c = self.cfg
        rc = ReaderConfig(ut=c.ut, lt=c.lt, depth=c.depth, group=c.request_batches, initial=c.teachers,
                          max_teachers=c.max_teachers,
                          wait_s=c.teacher_timeout_s, request_timeout_s=c.request_timeout_s, token=token_from_env(None))
        coord = Coordinator(c.coordinator or os.environ.get(ENV, ""), lease_s=c.lease_s)
        student = f"{socket.gethostname()}-{os.getpid()}-rank{self.ctx.comm.rank}"
        d = self.ctx.data
        assert d is not None, "EDL-Dist runs with its data in the context"
        return DistilReader(coord, student, d.in_shape, d.num_classes, rc, self.ctx.log, student_rate=rate)

    # ---- hooks ----------------------------------------------------------------------------------
    def batches(self, epoch: int, source):
        self.consumed: list[torch.Tensor] = []
        for batch in self.source.batches(epoch, source):
            self.consumed.append(batch.ids)
            yield batch

    def loss(self, batch, outputs, loss):
        if batch.logits is None:  # N-training
            return loss
        c = self.cfg
        return kd_loss(outputs, batch.logits, batch.y, c.alpha, c.beta, c.temperature, hard=loss)

    def end_epoch(self, epoch: int) -> dict:
        if self.cfg.log_samples:
            self.samples_log.write({"epoch": epoch, "ids": torch.cat(self.consumed).tolist()})
        figures, timeline = self.source.end_epoch()
        self.timeline.write_many([{"epoch": epoch, **point} for point in timeline])
        return figures

    def close(self) -> None:
        if hasattr(self, "source"):
            self.source.close()


def check_fits(data, in_shape, classes: int, path: str) -> None:
    if tuple(in_shape) != tuple(data.in_shape) or classes != data.num_classes:
        raise UsageError(f"teacher {path} takes inputs {tuple(in_shape)} with {classes} classes; the student's data "
                         f"has {tuple(data.in_shape)} with {data.num_classes} (train both on the same data set)")


def student_rate(model, ctx, seconds: float = 0.3) -> float:
    """Samples/s of one training step of this student on this device (a throwaway copy, no communication)."""
    probe = copy.deepcopy(model).to(ctx.device)
    b = ctx.cfg.train.batch_size
    sample = ctx.data.x_train[:b].to(ctx.device)  # real inputs: a language model's are token ids
    y = ctx.data.y_train[:b].to(ctx.device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 2 * b:
        outputs = probe(sample)
        torch.nn.functional.cross_entropy(outputs.flatten(0, -2), y.flatten()).backward()
        n += b
    return n / (time.perf_counter() - t0)
