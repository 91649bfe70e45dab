"""The rows of a comparison's CSV files, named once: `SummaryRow` is a row of summary.csv plus what the
table reads; `TuningRow` a row of tuning.csv, one tuning trial.

The runner makes one per run (lowband.comparison.runner.summarize); `ComparisonDir` (folder.py) alone
writes and reads summary.csv and tuning.csv through them; the report adds each run's records, the
table and the plots pool them by label, and the Python API hands them on. The CSV keeps the columns
below, in this order, so people and scripts read it as before; `metric`, `link`, `link_mode` and
`records` live in memory only (they come from the run's directory: its config and its metrics.jsonl).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from lowband.data.metric import ACCURACY, Metric
from lowband.errors import Diverged
from lowband.net.links import LinkSpec
from lowband.records import EpochRecord

MEMORY = {"csv": False}  # a field summary.csv does not hold


class CsvRow:
    """A dataclass written as one CSV row: its fields in order, less those marked MEMORY."""

    @classmethod
    def columns(cls) -> list[str]:
        """The CSV's header."""
        return [f.name for f in fields(cls) if f.metadata.get("csv", True)]  # type: ignore[arg-type]

    def csv_row(self) -> dict[str, Any]:
        """This row for the CSV (None as an empty cell)."""
        return {name: "" if getattr(self, name) is None else getattr(self, name) for name in self.columns()}

    @classmethod
    def from_csv(cls, row: dict[str, str]):
        """A CSV row read back: numbers parsed, empty or damaged cells as None (or the default)."""
        out = cls(label=row.get("label") or "", method=row.get("method") or "")  # type: ignore[call-arg]
        for f in fields(cls):  # type: ignore[arg-type]
            text = row.get(f.name)
            if f.name in ("label", "method") or not f.metadata.get("csv", True) or text is None or text == "":
                continue
            setattr(out, f.name, _parse(text, getattr(out, f.name), f.type))
        return out


@dataclass
class SummaryRow(CsvRow):
    """One run: its label and method, its final figures (of the global model; `final_*` are test
    figures), its bytes and seconds, its status (ok, diverged, failed (N)) and its directory."""

    label: str
    method: str
    seed: int | None = None
    workers: int = 1
    val_acc: float | None = None
    val_acc_L: float | None = None
    final_acc: float | None = None
    final_acc_L: float | None = None
    best_val_acc: float | None = None
    val_bpb: float | None = None
    final_bpb: float | None = None
    corpus_sha256: str | None = None
    epochs: int = 0
    samples: int | None = None
    bytes_sent_per_worker: float = 0.0
    sites: int = 0
    bytes_inter_per_worker: float = 0.0
    train_s: float = 0.0
    step_s: float | None = None  # one worker's step measured alone (lowband.comparison.calibrate)
    samples_per_s: float | None = None
    speedup: float | None = None
    tuned: str | None = None  # "optim.lr=0.1": what tuning chose for its label
    status: str = "ok"
    run_dir: str = ""
    metric: Metric = field(default=ACCURACY, metadata=MEMORY)
    link: LinkSpec | None = field(default=None, metadata=MEMORY)  # the link it was measured on
    link_mode: str = field(default="model", metadata=MEMORY)
    records: list[EpochRecord] = field(default_factory=list, repr=False, metadata=MEMORY)

@dataclass
class TuningRow(CsvRow):
    """One tuning trial, a row of tuning.csv: its label and method, its trial number, the tuned fields and
    their values (space-separated, in the same order: 'optim.lr method.tau' / '0.003 16'), the metric's
    validation figure (final, or the last one before it was pruned), the epochs it ran, its status (ok,
    pruned, diverged, failed (N), interrupted), whether it was chosen, its folder and its CPU seconds (its
processes' user + system). Only an `ok` trial is ever chosen."""

    label: str
    method: str
    trial: int = 0
    field: str = ""
    value: str = ""
    metric: str = ACCURACY.val_key
    val: float | None = None
    epochs: int = 0
    status: str = "ok"
    chosen: str = "no"
    run_dir: str = ""
    cpu_s: float | None = None

    @property
    def values(self) -> dict[str, str]:
        """{field: value as written}."""
        return dict(zip(self.field.split(), self.value.split(), strict=False))

    @property
    def is_chosen(self) -> bool:
        return self.chosen.strip().lower() in ("1", "true", "yes")


def status_of(code: int) -> str:
    """A run's status in summary.csv and the table: ok, diverged (lowband.errors.Diverged), or failed (code)."""
    return "ok" if code == 0 else "diverged" if code == Diverged.exit_code else f"failed ({code})"


def _parse(text: str, default: Any, kind: Any) -> Any:
    """A CSV cell as the field's type (`kind` is its annotation, a string under postponed evaluation)."""
    kind = str(kind)
    try:
        if kind.startswith("int"):
            return int(float(text))
        if kind.startswith("float"):
            value = float(text)
            return value if math.isfinite(value) else default
    except (ValueError, OverflowError):
        return default
    return text
