"""What an elastic job's worker writes when it is a round's source, and how a worker resumes from it.

When a round ends an epoch, the trainer asks every member for the epoch's record: the source of its
last round makes it (training/elastic/records.py: `lowband train`'s record of θ_global, evaluated on the
epochs train.eval_every names) and the trainer completes it and writes it through this worker's metrics
sink, so train.loggers mirror it; the source writes the round's line in quorums.jsonl, and on the epochs
train.checkpoint_every names the job's checkpoint (the trainer's `due` rule): the method's shared state
(θ_global, the outer optimizer, the clock) and what a receiver takes besides. After the last epoch every
member takes part in the method's final model; the source of that round writes model.safetensors, then
the job's status "finished" (a member that sees the source leave first finishes it instead). A worker
that starts (a resume, or a joiner when every holder of θ_global has gone) reads the newest intact
checkpoint and takes it as a receiver takes a source's state; so does a worker that arrives behind the
job (it was stopped) when that checkpoint is newer than its θ_global (`catch_up`).

`JobFiles` is the part of `ElasticWorker` that does this; the attributes it reads are the worker's
and are named below.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable

from torch import nn

from lowband.comm.elastic_quorum import ElasticQuorum
from lowband.comm.membership import Decision, Membership, wait_until
from lowband.comm.quorum import OuterState
from lowband.config import Config, ElasticConfig, to_dict
from lowband.errors import UsageError
from lowband.records import EpochRecord
from lowband.run import checkpoint
from lowband.run.loggers import build as build_loggers
from lowband.run.metrics import MetricsSink, read_metrics
from lowband.run.rundir import RunDir, Stream
from lowband.training.elastic.faults import Faults
from lowband.training.elastic.lineage import last_record, lost_rounds, span
from lowband.training.elastic.plan import DataPlan, Handout
from lowband.training.elastic.records import checkpoint_state, epoch_record
from lowband.training.trainer import Made, Steps, Trainer

JOB_FILE = "elastic.json"


def read_job(run_dir: str) -> dict:
    """RUN_DIR/elastic.json: the coordinator's URL and the job's id, written by the launcher."""
    path = os.path.join(run_dir, JOB_FILE)
    if not os.path.isfile(path):
        raise UsageError(f"{run_dir} is not an elastic job (no {JOB_FILE}); start one with "
                         "`lowband train --elastic`")
    try:
        with open(path, encoding="utf-8") as f:
            job = json.load(f)
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(f"{path} is damaged ({type(e).__name__}); continue the job with "
                         f"`lowband train --resume {run_dir}`, which writes it again") from None
    if not isinstance(job, dict) or not isinstance(job.get("coordinator"), str) or not isinstance(job.get("job"), str):
        raise UsageError(f"{path} is damaged (no coordinator URL and job id); continue the job with "
                         f"`lowband train --resume {run_dir}`, which writes it again")
    return job


class JobFiles:
    """The records, checkpoints and final model of an elastic job, as its worker writes and reads them."""

    # the worker's (training/elastic/worker.py), read here
    cfg: Config
    id: int
    run_dir: RunDir
    outer: ElasticQuorum | None
    members: Membership
    log: logging.Logger
    final: nn.Module | None
    sink: MetricsSink | None
    samples: int
    started: float  # the job's start, wall-clock seconds (elastic.json's started_at; JobFiles.clock)
    state: OuterState
    writes: int  # the epoch whose record this worker claimed (0: none)
    last_round: tuple[Decision, bool] | None  # the last round this worker committed, and whether it stepped
    seen_checkpoint: str | None  # the newest checkpoint this worker has read (catch_up reads each once)
    e: ElasticConfig
    faults: Faults | None
    fault: Callable[[int, str], None]  # a test's planned fault, if any (training/elastic/faults.py)
    data: DataPlan | None
    trainer: Trainer

    def close_files(self) -> None:
        """Close the experiment loggers this worker opened (it wrote an epoch's record)."""
        if self.sink is not None:
            self.sink.close()

    def write_round(self, q: Decision, outer: bool) -> None:
        """A committed round's line in quorums.jsonl, written by its source; `outer`: the round took an outer
        step (False: a meeting that handed out slices). Every member remembers the round; the source of the
        next one first writes this one's line if its source died between committing and writing it."""
        before, self.last_round = self.last_round, (q, outer)
        if q.members[0] != self.id:
            return
        stream = self.run_dir.stream("quorums")
        last = last_record(stream.path)
        if last is not None and last.get("round", -1) >= q.round:
            return  # written meanwhile by the next round's source (this one was stopped after committing)
        if before is not None and before[0].round < q.round and (last is None or last.get("round", -1) < before[0].round):
            self._round_line(stream, *before)  # its source died before writing it
        self.fault(q.round, "round")  # a test's fault: the source dies between committing and writing
        lost = lost_rounds(stream.path, q.version + 1, q.round)
        if lost:
            self.log.warning(f"worker {self.id}: round {q.round} goes on from θ_global version {q.version}: "
                             f"{span(lost)} {'was' if len(lost) == 1 else 'were'} held only by workers that "
                             "left; their training is lost and their samples are handed out again")
        self._round_line(stream, q, outer)

    def _round_line(self, stream: Stream, q: Decision, outer: bool) -> None:
        h = Handout.of(q)
        stream.write({
            "round": q.round, "attempt": q.attempt, "outer_step": outer, "members": q.members,
            "contributors": q.contributors,
            "receivers": q.receivers, "version": q.version + 1, "epoch": h.epoch + 1, "slices": h.slices,
            "dropped": h.dropped, "elapsed_s": self.clock()})

    def clock(self) -> float:
        """Seconds since the job started (the time it was down before a resume not counted), the same clock
        for every worker on the machine, whoever writes a record: the launcher wrote the start in
        elastic.json. Workers on other machines read it by their own wall clocks."""
        return round(time.time() - self.started, 3)

    def _ended(self, epoch: int) -> tuple[Decision, Handout] | None:
        """The round this worker committed that ended epoch `epoch`, and its handout; None if it has none."""
        ended = self.data.ended if self.data is not None else None
        return ended if ended is not None and ended[1].epoch_end == epoch else None

    def _writer(self, epoch: int) -> tuple[Decision, Handout] | None:
        """The round that ended epoch `epoch`, when this worker writes its record and checkpoint (it holds the
        coordinator's claim on the epoch); else None."""
        return self._ended(epoch) if self.writes == epoch else None

    def _claim(self, epoch: int) -> bool:
        """Whether this worker writes epoch `epoch`'s record: the source of its last round claims it first;
        every other member of the round that ended the epoch waits until the record is in metrics.jsonl, and
        takes the claim over if its holder is gone before writing it (a record is written once, whoever dies).
        False once the record is written (by another) or the job has finished without it."""
        assert self.outer is not None
        outer, members = self.outer, self.members
        start, deadline = time.monotonic(), time.monotonic() + self.cfg.elastic.wait_s
        source = outer.q.members[0] if outer.q is not None else self.id
        if source == self.id:
            outer.ask(lambda: members.claim_record(epoch))
        while time.monotonic() < deadline:
            if any(r.epoch == epoch for r in read_metrics(self.run_dir.path)):
                return False
            holder, live = outer.ask(lambda: members.record_holder(epoch)), outer.ask(members.live)
            unclaimed_too_long = holder is None and (source not in live or time.monotonic() - start > self.e.dead_after_s)
            if unclaimed_too_long or (holder is not None and holder not in live):
                if holder is not None:
                    self.log.warning(f"worker {self.id}: epoch {epoch}'s record was owed by worker {holder}, who "
                                     "left before writing it; writing it")
                holder = outer.ask(functools.partial(members.claim_record, epoch, take=holder is not None))
            if holder == self.id:
                self.writes = epoch
                self.fault(epoch, "record")  # a test's fault: the writer dies holding the claim
                return True
            time.sleep(0.1)
        return False

    def _finish_job(self, glob: nn.Module | None) -> None:
        """The job's final model, then its status: finished."""
        glob = glob if glob is not None else self.trainer.method.global_model(final=False)
        assert glob is not None  # a method that runs elastic has a global model (θ_global)
        checkpoint.save_model(glob.state_dict(), self.run_dir.model_path(0), self.trainer.model_metadata())
        self.outer.ask(self.members.finish) if self.outer else self.members.finish()
        self.log.info(f"worker {self.id}: last epoch done; model.safetensors written")

    def _see_finished(self, q: Decision) -> None:
        """After the last round, a member that is not its source waits for the source to finish the job,
        and finishes it itself if the source died first (all members hold the same θ_global)."""
        source = q.members[0]
        gone = wait_until(lambda: (self.members.status() == "finished" or source not in self.members.live()) or None,
                          self.cfg.elastic.wait_s, poll_s=0.1)
        if gone and self.members.status() != "finished":
            self.log.warning(f"worker {self.id}: the last round's source (worker {source}) left before finishing "
                             "the job; finishing it")
            self._finish_job(self.final)

    def record(self, trainer: Trainer, epoch: int, done: Steps, evaluate: bool) -> Made | None:
        """The job's record of epoch `epoch` (training/elastic/records.py), when this worker is the source of its
        last round; θ_global evaluated when `evaluate`. After the last epoch every member first takes part
        in the method's final model (its last outer steps are a round of their own)."""
        if epoch == self.cfg.train.epochs:
            self.final = trainer.method.global_model(final=True)
        if self._ended(epoch) is None or not self._claim(epoch):
            return None  # another member of the round that ended it writes it (or this worker joined after)
        ended = self._writer(epoch)
        assert ended is not None
        q, h = ended
        glob = self.final if self.final is not None else trainer.method.global_model(final=False)
        scores = trainer.scores(glob) if evaluate and glob is not None else None
        record = epoch_record(q, h, scores, trainer.metric, self._ledgers(), samples=h.epoch_end * self.samples)
        return Made(record, self.samples, read_metrics(self.run_dir.path))

    def keep(self, trainer: Trainer, epoch: int, record: EpochRecord | None, checkpoint: bool) -> None:
        """The record when this worker made it; the job's checkpoint when asked and this worker wrote it."""
        if record is not None:
            self._write(record)
        if checkpoint:
            self._checkpoint(epoch)

    def _write(self, record: EpochRecord) -> None:
        """The record, unless another worker took the claim over meanwhile (this one was stopped past
        `dead_after_s` while evaluating, and the other wrote it): then neither it nor the checkpoint."""
        assert self.outer is not None
        holder = self.outer.ask(lambda: self.members.record_holder(record.epoch))
        written = any(r.epoch == record.epoch for r in read_metrics(self.run_dir.path))
        if written or holder not in (self.id, None):
            by = f"worker {holder}" if holder not in (self.id, None) else "another worker"
            self.log.warning(f"worker {self.id}: epoch {record.epoch}'s record was {'written' if written else 'claimed'} "
                             f"by {by} while this worker was away; not writing it twice")
            self.writes = 0
            return
        record.time = {**(record.time or {}), "elapsed_s": self.clock()}  # the job's clock, not this worker's
        self._sink().write(record)

    def _sink(self) -> MetricsSink:
        """The job's metrics stream and experiment loggers (train.loggers), as `lowband train`'s reporter
        feeds them. Each worker that writes an epoch's record opens the loggers once, for the job as a
        whole (rank 0's folders): TensorBoard then reads one curve from every writer's event file."""
        if self.sink is None:
            built = build_loggers(list(self.cfg.train.loggers), self.run_dir.path, 0, to_dict(self.cfg))
            self.sink = MetricsSink(self.run_dir.stream("metrics"), True, self.cfg.train.epochs, self.log, built,
                                    job_clock=self.clock)
        return self.sink

    def _ledgers(self) -> dict:
        """Every worker's published bytes by tag (a resumed job's earlier part under EARLIER)."""
        return wait_until(self.members.ledgers, 30.0, poll_s=0.2) or {}

    def _checkpoint(self, epoch: int) -> None:
        """The job's state after epoch `epoch` (rank 0's checkpoint of it), written by the writer of its record."""
        if self._writer(epoch) is None or self.outer is None or self.data is None:
            return
        o, method = self.outer, self.state
        state = checkpoint_state(o.version, o.meet.next_round, self.data.epoch, method.shared_state(), method.handover(),
                                 self._ledgers())
        checkpoint.save_state(state, checkpoint.rank_path(self.run_dir.path, 0, epoch))  # the job's: rank 0's
        checkpoint.prune(self.run_dir.path, 0)

    def _resume(self, method: OuterState, said: bool) -> None:
        """Start from the job's newest intact checkpoint, if any (`said`: a resume, which warns without one),
        taking its state as a receiver takes a source's."""
        path, passed = checkpoint.newest_intact(self.run_dir.path)
        if passed:
            self.log.warning(f"worker {self.id}: passed over newer checkpoints: {'; '.join(passed)}")
        self.seen_checkpoint = path
        if path is None:
            if said:
                self.log.warning(f"worker {self.id}: no elastic checkpoint in {self.run_dir.path}; starting from "
                                 "scratch")
            return
        state = self._checkpoint_state(path)
        self._take(method, state, from_checkpoint=not said)
        self.log.info(f"worker {self.id}: starts from {path} (round {state['round']})")

    def catch_up(self) -> None:
        """This worker arrives behind the job (rounds were committed without it: it was stopped, or left
        out): if the job's newest checkpoint holds a newer θ_global than this worker's, take it, as a joiner
        does. A worker that holds a newer one still is the round's source and this one receives; but if
        every such worker has left, the job goes on from the checkpoint, not from this worker's older
        θ_global (which would lose the rounds the checkpoint kept). Each checkpoint is read at most once."""
        assert self.outer is not None
        saved = checkpoint.epochs_saved(self.run_dir.path, 0)
        if not saved or checkpoint.rank_path(self.run_dir.path, 0, saved[-1]) == self.seen_checkpoint:
            return
        path, _ = checkpoint.newest_intact(self.run_dir.path)
        if path is None or path == self.seen_checkpoint:
            return
        self.seen_checkpoint = path
        try:
            state = self._checkpoint_state(path)
        except (UsageError, OSError) as e:  # pruned or replaced meanwhile: go on with this worker's θ_global
            self.log.warning(f"worker {self.id}: could not read {path} to catch up ({e}); going on without it")
            return
        if int(state["version"]) <= self.outer.version:
            return
        held = self.outer.version
        self._take(self.state, state, from_checkpoint=True)
        self.log.info(f"worker {self.id}: behind the job with θ_global version {held}; takes {path} (version "
                      f"{state['version']}, round {state['round']})")

    @staticmethod
    def _checkpoint_state(path: str) -> dict:
        state = checkpoint.load_state(path)
        if "shared" not in state:
            raise UsageError(f"{path} is an elastic checkpoint of an older lowband (no method state); finish the job "
                             "with that version, or start it anew")
        return state

    def _take(self, method: OuterState, state: dict, from_checkpoint: bool) -> None:
        """A checkpoint's state into the method (as a receiver takes a source's) and the quorum's place."""
        method.receive(state["shared"], state["extra"])
        assert self.outer is not None and self.data is not None
        self.outer.resume_at(int(state["version"]), int(state["round"]), from_checkpoint)
        self.data.resume_at(int(state["epoch"]))
