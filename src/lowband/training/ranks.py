"""`lowband train`'s team (training/trainer.py's `Team`): the launched ranks, the same every epoch.

Each rank trains its shard of the data plan (`rank_batches`, through the method's `batches`); the
method's own hooks synchronise the ranks over one communicator, inside the steps. At each epoch's end
every rank measures its own model and the ranks gather their figures over the record's scope
(run/reporter.py: the world for methods that train one model together, the rank alone for those
whose ranks train separate models); the scope's first rank writes the record, with the global
model's scores. Each rank checkpoints its own state, and a resume starts from the newest epoch every
rank has intact (run/checkpoint.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from lowband.comm import BOOKKEEPING_TAGS, Communicator
from lowband.comm.quorum import FixedQuorum
from lowband.config import Config, to_dict
from lowband.data import Batch
from lowband.net.sites import configured, describe
from lowband.records import EpochRecord
from lowband.registry import METHODS
from lowband.run import checkpoint
from lowband.run.metrics import setup_logging
from lowband.run.reporter import EpochReporter, RankFigures, TrainingError, own_evaluators, tag_bytes
from lowband.run.rundir import RunDir
from lowband.training.trainer import Made, Resumed, Seat, Steps, Trainer, rank_batches


class FixedRanks:
    """The ranks of one communicator, every epoch: the trainer's `Team` in `lowband train`."""

    def __init__(self, cfg: Config, comm: Communicator, run_dir: str):
        self.cfg, self.comm = cfg, comm
        self.rank, self.width, self.device = comm.rank, comm.world, comm.device
        self.run = RunDir(run_dir, self.rank)
        self.log = setup_logging(run_dir, self.rank)
        # ranks that train one model together report together; separate models report alone
        self.scope = comm.alone() if METHODS.get(cfg.method.name).independent_models else comm
        self.final_global: torch.nn.Module | None = None  # the global model of the latest evaluated epoch
        self.best_local_rank = 0
        self.samples = 0  # trained by this rank since the run began

    def join(self, trainer: Trainer) -> Seat:
        """This rank's seat: its communicator, its shard of the data plan, every rank in every outer step."""
        cfg = self.cfg
        self.batches = rank_batches(cfg, trainer.plan, self.rank, self.device)
        self.reporter = EpochReporter(self.scope, self.run, self.log, cfg.train.epochs, cfg.train.loggers,
                                      to_dict(cfg), trainer.metric)
        return Seat(self.rank, self.comm, self.device, self.log, FixedQuorum, trainer.plan.shards[self.rank],
                    functools.partial(self.comm.ledger.seconds, leave_out=BOOKKEEPING_TAGS))

    # ---- the epochs --------------------------------------------------------------------------
    def start(self, trainer: Trainer, resume: bool) -> Resumed | None:
        resumed = self._resume(trainer) if resume else None
        if resumed is None and self.rank == 0:
            self.log.info(self._banner(trainer))
        return resumed

    def epochs(self, trainer: Trainer) -> Iterator[tuple[int, Iterator[tuple[Batch, float]]]]:
        """The epochs left (all of them, or those after a resume), each with this rank's minibatches; they
        end early once the scope's first rank has reached the target (train.stop_at_target)."""
        for epoch in range(trainer.epoch + 1, self.cfg.train.epochs + 1):
            yield epoch, self._feed(trainer, epoch)
            if self._stop(trainer):
                self.log.info(f"stopping at epoch {epoch}: validation {trainer.metric.name} reached "
                              f"{trainer.target():.4f}")
                return

    def _feed(self, trainer: Trainer, epoch: int) -> Iterator[tuple[Batch, float]]:
        """This rank's minibatches of epoch `epoch` (as the method hands them), each at its place in the run."""
        steps = trainer.plan.steps
        batches = iter(trainer.method.batches(epoch, self.batches))
        for i in self.reporter.sink.steps(range(steps), epoch, steps):
            yield next(batches), epoch - 1 + i / steps

    def _stop(self, trainer: Trainer) -> bool:
        if not self.cfg.train.stop_at_target:
            return False
        flag = torch.tensor([1.0 if trainer.reached_target is not None else 0.0], device=self.device)
        self.scope.broadcast(flag, src=0, tag="control")  # the scope follows its first rank's model
        return bool(flag.item())

    # ---- the records -------------------------------------------------------------------------
    def record(self, trainer: Trainer, epoch: int, done: Steps, evaluate: bool) -> Made:
        """Every rank's figures gathered over the scope, and the global model's scores when `evaluate`;
        the record (every rank builds it, the scope's first writes it) and the samples of the epoch."""
        method, last = trainer.method, epoch == self.cfg.train.epochs
        self.samples += done.taken * self.cfg.train.batch_size
        mine = RankFigures(loss=done.loss, samples=done.taken * self.cfg.train.batch_size, seen=self.samples)
        glob, glob_scores = None, None
        if evaluate and self._evaluates_own(done.loss):
            local = trainer.scores(method.local_model())
            mine.test_acc, mine.val_acc, mine.test_loss, mine.val_loss = (
                local.test_acc, local.val_acc, local.test_loss, local.val_loss)
        if evaluate:
            glob = method.global_model(final=last)
            glob_scores = trainer.scores(glob) if glob is not None and self.scope.rank == 0 else None
        mine.bytes = tag_bytes(self.comm)  # after the global model, whose final exchange counts
        ranks = self.reporter.gather(mine)
        self.best_local_rank = self.scope.global_ranks[self.reporter.best_local(ranks)]
        record = self.reporter.record(epoch, ranks, glob_scores)
        if evaluate:  # the stopping epoch of an early stop is always evaluated
            self.final_global = glob
        return Made(record, sum(r.samples for r in ranks))

    def _evaluates_own(self, loss: float) -> bool:
        """Whether this rank evaluates its own model this epoch (train.eval_ranks, `own_evaluators`): every rank
        up to that many; past it, the epoch's training losses are gathered first (under "metrics"), so that the
        rank with the lowest is among those that do. Many workers on one machine spent most of an epoch on
        every rank's evaluation."""
        n = self.cfg.train.eval_ranks
        if n == 0 or self.scope.world <= n:
            return True
        losses = self.scope.all_gather(torch.tensor([loss], dtype=torch.float64, device=self.device), tag="metrics")
        return self.scope.rank in own_evaluators([float(x.item()) for x in losses], n)

    def keep(self, trainer: Trainer, epoch: int, record: EpochRecord | None, checkpoint: bool) -> None:
        """The record through the reporter (the scope's first rank writes it); this rank's checkpoint."""
        if record is not None:
            self.reporter.write(record)
        if checkpoint:
            self._checkpoint(trainer, epoch)

    def finish(self, trainer: Trainer) -> None:
        """The scope's final model (the global one if the method has one, else this rank's); model_L too."""
        glob, local = self.final_global, trainer.method.local_model()
        if self.scope.rank == 0:
            final = glob if glob is not None else local
            checkpoint.save_model(final.state_dict(), self.run.model_path(self.rank), trainer.model_metadata())
        if glob is not None and self.rank == self.best_local_rank:
            checkpoint.save_model(local.state_dict(), self.run.local_model_path(), trainer.model_metadata())

    def close(self, trainer: Trainer) -> None:
        self.reporter.close()

    # ---- checkpoints -------------------------------------------------------------------------
    def _checkpoint(self, trainer: Trainer, epoch: int) -> None:
        t = trainer
        state = {
            "epoch": epoch, "step": t.step, "samples": self.samples, "elapsed": t.elapsed,
            "model": t.method.local_model().state_dict(), "reached_target": t.reached_target or 0,
            "optimizer": t.optimizer.state_dict(), "method": t.method.state_dict(),
            "comm": self.comm.ledger.snapshot(), "rng": torch.get_rng_state(), "train_s": t.train_s,
        }
        checkpoint.save_state(state, checkpoint.rank_path(self.run.path, self.rank, epoch))
        checkpoint.prune(self.run.path, self.rank)

    def _resume(self, t: Trainer) -> Resumed | None:
        """The newest epoch every rank of the scope has intact, loaded; the trainer's counters from it."""
        epoch, passed = checkpoint.resumable_epoch(self.run.path, self.scope.global_ranks)
        if passed and self.scope.rank == 0:
            self.log.warning(f"resuming from epoch {epoch}, the newest intact epoch every rank has: "
                             f"{'; '.join(passed)}")
        agreed = self.scope.all_gather(torch.tensor([epoch], device=self.device), tag="control")
        if len({int(a.item()) for a in agreed}) != 1:
            raise TrainingError(f"ranks see different checkpoints ({[int(a) for a in agreed]}); is the run dir shared?")
        self.run.cut_back(epoch)  # records past the checkpoint would be written twice
        if epoch == 0:
            some = checkpoint.ranks_saved(self.run.path)
            why = (f"no epoch that every rank finished checkpointing (ranks {some} saved one, the others were "
                   "stopped first)" if some else "no checkpoint")
            self.log.warning(f"{why} in {self.run.path}; starting from scratch")
            return None
        state = checkpoint.load_state(checkpoint.rank_path(self.run.path, self.rank, epoch))
        t.method.local_model().load_state_dict(state["model"])
        t.optimizer.load_state_dict(state["optimizer"])
        t.method.load_state_dict(state["method"])
        self.comm.ledger.load_snapshot(state["comm"])
        torch.set_rng_state(state["rng"])
        self.samples = state["samples"]
        self.log.info(f"resumed {self.run.path} after epoch {epoch} (step {state['step']})")
        return Resumed(state["epoch"], state["step"], state["elapsed"], state.get("train_s", 0.0),
                       state.get("reached_target") or None)

    # ---- the banner --------------------------------------------------------------------------
    def _banner(self, t: Trainer) -> str:
        c, d = self.cfg, t.plan.data
        params = sum(p.numel() for p in t.method.local_model().parameters())
        val = 0 if d.y_val is None else len(d.y_val)
        meta = d.meta
        corpus = f" windows of {meta['corpus_bytes']:,} bytes (sha256 {meta['corpus_sha256'][:12]})" if meta else ""
        link = c.link
        sites = f"; {describe(link.site_map(self.width))}" if configured(link.sites, link.site_of) else ""
        return (f"{c.method.name}: {self.width} worker(s), backend {self.comm.backend}, device {self.device}; "
                f"{c.data.name} {len(d.y_train)} train / {val} validation / {len(d.y_test)} test{corpus}, partition "
                f"{c.data.partition}; {c.model.name} {params:,} parameters; {t.plan.steps} steps/epoch x "
                f"{c.train.epochs} epochs, batch {c.train.batch_size}/worker; run dir {self.run.path}" + sites)
