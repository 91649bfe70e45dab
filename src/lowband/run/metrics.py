"""One sink for every figure: metrics.jsonl always, a progress bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from tqdm import tqdm

from lowband.records import EpochRecord
from lowband.run.loggers import scalars
from lowband.run.rundir import RunDir, read_jsonl
from lowband.units import si


def setup_logging(run_dir: str, rank: int, elastic: bool = False) -> logging.Logger:
    """Rank 0 logs to the console and RUN_DIR/train.log; other ranks only warnings, with their rank.
    An elastic job's workers (`elastic`, `rank` the worker id) are peers: each logs to stdout, its id
    on every line, and appends to train.log."""
    log = logging.getLogger("lowband")
    log.handlers.clear()
    log.propagate = False
    leads = rank == 0 or elastic
    log.setLevel(logging.INFO if leads else logging.WARNING)
    console: logging.Handler = logging.StreamHandler(sys.stdout) if elastic else _TqdmHandler()
    if quiet():
        console.setLevel(logging.WARNING)  # --quiet: train.log keeps the epoch lines
    prefix = f"[worker {rank}] " if elastic else "" if rank == 0 else f"[rank {rank}] "
    console.setFormatter(logging.Formatter(prefix + "%(message)s"))
    log.addHandler(console)
    if leads:
        fh = logging.FileHandler(RunDir(run_dir).log_path)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(fh)
    return log


def quiet() -> bool:
    """--quiet (LOWBAND_QUIET=1, inherited by the workers): no epoch lines or bar on the console."""
    return os.environ.get("LOWBAND_QUIET") == "1"


class _TqdmHandler(logging.Handler):
    def emit(self, record):
        tqdm.write(self.format(record), file=sys.stderr if record.levelno >= logging.WARNING else sys.stdout)


def read_metrics(run_dir: str, filename: str = "metrics.jsonl", check=None) -> list[EpochRecord]:
    """A run's epoch records; damaged lines (and records whose epoch is not a whole number) are
    skipped with a warning naming file and line. `check` adds a reason of its own."""
    def whole_epoch(record: dict) -> str | None:
        if not isinstance(record.get("epoch", 0), int):
            return f"epoch {record['epoch']!r} is not an integer"
        if "epoch" not in record:
            return "no epoch"
        return check(record) if check else None

    return [EpochRecord.from_json(r) for r in read_jsonl(os.path.join(run_dir, filename), whole_epoch)]


class MetricsSink:
    """Writes epoch records to a run's `metrics` stream (when active) and drives the progress display."""

    def __init__(self, stream, active: bool, total_epochs: int, log: logging.Logger, loggers: Sequence = (),
                 job_clock: Callable[[], float] | None = None):
        """`job_clock`: seconds since the run began, where that is not this process's start (an elastic job's
        clock: whichever worker writes an epoch's line, it began with the job)."""
        self.stream = stream
        self.active, self.total_epochs, self.log = active, total_epochs, log
        self.tty = active and sys.stderr.isatty() and not quiet()
        self.started = time.monotonic()  # wall clock of this process, for the ETA
        self.job_clock = job_clock
        self.first_epoch: int | None = None
        self.loggers = list(loggers)  # experiment loggers (lowband.run.loggers), fed every record

    def steps(self, iterable, epoch: int, total: int):
        if not self.tty:
            return iterable
        return tqdm(iterable, total=total, desc=f"epoch {epoch}/{self.total_epochs}", leave=False,
                    dynamic_ncols=True, file=sys.stderr)

    def write(self, record: EpochRecord) -> None:
        """The record to metrics.jsonl and every experiment logger, and its line on the console."""
        if not self.active:
            return
        self.publish(record)
        self.log.info(format_record(record, self.total_epochs) + "  " + self.progress(record.epoch))

    def publish(self, record: EpochRecord) -> None:
        """The record to metrics.jsonl and every experiment logger, without a console line (an elastic
        job's source says its own: the round and the workers)."""
        self.stream.write(record.to_json())
        if self.loggers:
            figures = scalars(record)
            for logger in self.loggers:
                logger.log(figures, record.epoch)

    def progress(self, epoch: int) -> str:
        """'elapsed 12s  ETA 48s': wall time since this process started training (or by the job's clock),
        and the rest of the run at the mean time per epoch so far."""
        if self.first_epoch is None:
            self.first_epoch = 1 if self.job_clock else epoch
        elapsed = self.job_clock() if self.job_clock else time.monotonic() - self.started
        per_epoch = elapsed / max(epoch - self.first_epoch + 1, 1)
        return f"elapsed {clock(elapsed)}  ETA {clock(per_epoch * max(self.total_epochs - epoch, 0))}"

    def close(self) -> None:
        """Close every experiment logger (flushes their files)."""
        for logger in self.loggers:
            logger.close()
        self.loggers = []


def format_record(r: EpochRecord, total_epochs: int) -> str:
    acc = "   -  " if r.val_acc is None else f"{r.val_acc:.4f}"
    bpb = f"val bpb {r.val_bpb:.4f}  " if r.val_bpb is not None else ""
    t, lr, loss = r.time, r.lr or 0.0, r.train_loss or 0.0
    crew = f"  round {r.extra['rounds'] - 1}, {r.extra['workers']} worker(s)" if "workers" in r.extra else ""
    return (f"epoch {r.epoch:>3}/{total_epochs}  loss {loss:.4f}  {bpb}val acc {acc}  "
            f"lr {lr:.4g}  sent/worker {human_bytes(r.bytes_sent_per_worker)}  "
            f"compute {t['compute_s']:.1f}s comm {t['comm_s']:.1f}s wait {t['wait_s']:.1f}s{crew}")


def clock(seconds: float) -> str:
    """42s, 3m05s, 1h02m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def human_bytes(n: float) -> str:
    """1234 -> '1.23 kB', 12 -> '12 B': bytes as the records, logs and table show them."""
    return si(n, "B", ".2f", plain=".0f")


def median(values: list[float]) -> float | None:
    """The median, or None for no values (a run that recorded none)."""
    return statistics.median(values) if values else None
