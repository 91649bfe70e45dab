"""What a run writes per epoch, named once: `EpochRecord` is one line of metrics.jsonl.

The reporter (lowband.run.reporter) and the elastic worker build records; the comparison (table,
projection, plots, report), the Python API and the experiment loggers read them through their
attributes, never by a string key. The file stays flat JSON, one object a line, so a person or
another tool reads it as before: `to_json` writes the fields in the order below, followed by the
method's own figures (`extra`: a method's `end_epoch`, an elastic job's rounds and workers), and
`from_json` takes any keys it does not know into `extra`.

Byte figures are cumulative since the run began (see lowband.run.reporter for their meaning);
`time` holds the seconds the trainer measured (`epoch_train_s`, `compute_s`, `comm_s`, `wait_s`,
`eval_s`, `train_s`, `elapsed_s`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any

# Written only when they have a value: data that is not a corpus has no corpus hash; a classifier's
# records carry no bits per byte (a language model's carry both, one null without a validation split).
_ONLY_WHEN_SET = frozenset({"corpus_sha256", "corpus_bytes", "params"})
_BPB = ("val_bpb", "test_bpb")


@dataclass
class Scores:
    """One model evaluated: accuracy and mean cross-entropy (nats) on the test and validation splits
    (validation None without a validation split)."""

    test_acc: float | None = None
    val_acc: float | None = None
    test_loss: float | None = None
    val_loss: float | None = None


@dataclass
class EpochRecord:
    """One epoch of one run (or of one model, for methods whose ranks train separate models)."""

    epoch: int
    samples: int | None = None  # trained on since the run began, over the scope's ranks
    train_loss: float | None = None
    train_loss_ranks: list[float] | None = None
    test_acc: float | None = None  # the global model's (rank 0's own without one); None: not evaluated
    val_acc: float | None = None
    test_loss: float | None = None  # mean cross-entropy in nats (a language model: per byte)
    val_loss: float | None = None
    val_bpb: float | None = None  # a language model's loss in bits per byte
    test_bpb: float | None = None
    test_acc_L: float | None = None  # the best local model's (EC-DNN's _L)
    val_acc_L: float | None = None
    test_acc_ranks: list[float | None] | None = None
    val_acc_ranks: list[float | None] | None = None
    bytes_sent_per_worker: float = 0.0
    bytes_recv_per_worker: float | None = None
    bytes_inter_per_worker: float | None = None  # None: no site map, every byte counts as crossing
    # tag -> {"sent", "recv", "calls", "wire", "inter"}, the mean per worker
    bytes: dict[str, dict[str, float]] = field(default_factory=dict)
    bytes_total: dict[str, dict[str, float]] = field(default_factory=dict)  # the same, summed over the scope's ranks
    steps: int | None = None  # optimizer steps of one worker since the run began
    samples_per_s: float | None = None
    lr: float | None = None
    time: dict[str, float] = field(default_factory=dict)
    corpus_sha256: str | None = None
    corpus_bytes: int | None = None
    params: int | None = None  # the model's parameter count (one copy)
    reached_target_epoch: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        """The figure a metric names (lowband.data.metric.Metric.val_key: "val_acc" or "val_bpb"), or a
        method's own figure in `extra` (None when the record has neither)."""
        return getattr(self, key) if key in _FIELDS else self.extra.get(key)

    def __getitem__(self, key: str) -> Any:
        """Reading a record as the dict it was before 0.3 (`record["val_acc"]`) still works, with a
        DeprecationWarning: use the attribute (`record.val_acc`)."""
        warnings.warn("EpochRecord[key] is deprecated; read the attribute (record.val_acc) or record.value(key)",
                      DeprecationWarning, stacklevel=2)
        return self.to_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated dict-style read, as `__getitem__`."""
        warnings.warn("EpochRecord.get(key) is deprecated; read the attribute or record.value(key)",
                      DeprecationWarning, stacklevel=2)
        return self.to_json().get(key, default)

    @property
    def evaluated(self) -> bool:
        """True when this epoch's models were evaluated (validation or test)."""
        return self.val_acc is not None or self.test_acc is not None

    @property
    def train_s(self) -> float:
        """Training seconds since the run began (0 when the record has none)."""
        return float(self.time.get("train_s", 0.0))

    @property
    def inter_or_sent(self) -> float:
        """Bytes per worker that crossed a site boundary; all bytes sent when the run had no site map."""
        return self.bytes_sent_per_worker if self.bytes_inter_per_worker is None else self.bytes_inter_per_worker

    def to_json(self) -> dict[str, Any]:
        """The flat dict written to metrics.jsonl (every run's: `lowband train`'s and an elastic job's)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        bpb = any(out[k] is not None for k in _BPB)
        out = {k: v for k, v in out.items()
               if not (v is None and (k in _ONLY_WHEN_SET or (k in _BPB and not bpb)))}
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EpochRecord:
        """A record read back (unknown keys go to `extra`); raises KeyError without an epoch."""
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in raw.items() if k in known},
                   extra={k: v for k, v in raw.items() if k not in known})


_FIELDS = frozenset(f.name for f in fields(EpochRecord)) - {"extra"}
