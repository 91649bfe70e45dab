"""What a workload is judged by: its metric, which way is better, and when a run reaches a target.

A classifier is judged by validation accuracy: higher is better, and a run reaches the target when
its accuracy is at least the target. A byte-level language model is judged by validation loss in
bits per byte (the mean next-byte cross-entropy in nats divided by ln 2): lower is better, and a run
reaches the target when its loss is within a relative margin (default 1%) of it; next-byte accuracy
is reported beside it. Records hold `val_<key>` and `test_<key>` for the metric's key; targets,
tuning, tables, plots and the link projection read those through a `Metric`, never a fixed name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lowband.config import is_text_data

LN2 = math.log(2.0)


@dataclass(frozen=True)
class Metric:
    """A workload's metric: records hold `val_<key>` / `test_<key>`; `margin` is relative (a loss
    within `margin` of the target reaches it)."""

    key: str
    short: str  # the word in table columns: "acc", "bpb"
    name: str  # "accuracy", "bits per byte"
    higher_is_better: bool
    margin: float = 0.0
    from_loss: bool = False  # the figure is the validation loss in other units (bits per byte): records carry
    #                          val_<key> / test_<key> beside the loss, and a run's target is train.target_<key>

    @property
    def val_key(self) -> str:
        return f"val_{self.key}"

    @property
    def test_key(self) -> str:
        return f"test_{self.key}"

    def reaches(self, value: float | None, target: float | None) -> bool:
        """Whether `value` counts as reaching `target` (None never does)."""
        if value is None or target is None:
            return False
        if self.higher_is_better:
            return value >= target * (1.0 - self.margin)
        return value <= target * (1.0 + self.margin)

    def better(self, a: float, b: float) -> bool:
        """Whether `a` is strictly better than `b`."""
        return a > b if self.higher_is_better else a < b

    def best(self, values: list[float]) -> float:
        return max(values) if self.higher_is_better else min(values)

    def gap(self, value: float, target: float) -> str:
        """How far `value` is from `target`, in the metric's own words ('+0.50 pts', '+1.20%')."""
        if self.higher_is_better:
            return f"{100 * (value - target):+.2f} pts"
        return f"{100 * (value / target - 1.0):+.2f}%"

    def describe_target(self, target: float | None, why: str) -> str:
        shown = "-" if target is None else f"{target:.4f}"
        within = f"; reached within {self.margin:.0%} of it ({'at least' if self.higher_is_better else 'at most'} " \
                 f"{self.threshold(target):.4f})" if self.margin and target is not None else ""
        return f"Target {self.name} (validation): {shown} ({why}){within}"

    def threshold(self, target: float) -> float:
        """The value a run must reach: the target less (accuracy) or plus (loss) the margin."""
        return target * (1.0 - self.margin) if self.higher_is_better else target * (1.0 + self.margin)

    def with_margin(self, margin: float) -> Metric:
        return replace(self, margin=margin)


ACCURACY = Metric("acc", "acc", "accuracy", True)
BITS_PER_BYTE = Metric("bpb", "bpb", "bits per byte", False, margin=0.01, from_loss=True)


def task_of(data_name: str) -> str:
    """The one rule for what the data is: 'lm' for the text corpora (`text`, `text:PATH`) and for a user's data
    set of token windows (lowband.data.custom: targets at every position, as TensorData.task reads them),
    else 'classify'. The model (models.base.build_for_task), the metric and the methods follow it."""
    if is_text_data(data_name):
        return "lm"
    from lowband.data.custom import custom_task, is_custom  # torch: only a user's own data loads it here

    return custom_task(data_name) if is_custom(data_name) else "classify"


def metric_for(data_name: str) -> Metric:
    """The metric a data set's workload is judged by."""
    return BITS_PER_BYTE if task_of(data_name) == "lm" else ACCURACY


def bits_per_byte(loss_nats: float | None) -> float | None:
    """A mean next-byte cross-entropy in nats as bits per byte."""
    return None if loss_nats is None else loss_nats / LN2
