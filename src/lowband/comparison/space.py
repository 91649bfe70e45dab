"""What `--tune` searches: one `Param` per field, read from the command line, and the `Tune` around them.

A field is SECTION.KEY (`optim.lr`, `method.tau`) with one of

    V1,V2,...        a list of values (a grid axis)
    log:LO:HI:N      N values from LO to HI evenly spaced on a log scale (a grid axis)
    LO:HI            a range, sampled uniformly
    log:LO:HI        a range, sampled on a log scale (0 < LO)

A `method.*` field applies to the methods that have it (lowband.comparison.plan resolves which, and
whether the field takes integers: then ranges sample integers and list values must be whole). The
sampler of a method (`--tune-sampler auto`) is the axis search when every field it tunes is a list
(one field at a time: lowband.comparison.axis), TPE otherwise; `grid` runs every combination (or
`trials` of them at random). The pruner stops trials whose validation figure falls behind
(lowband.comparison.tuning).
Nothing here imports Optuna: parsing is checked before any folder exists.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import asdict, dataclass, replace
from typing import Literal

from lowband.config import check_bounds, opt
from lowband.errors import require

Sampler = Literal["auto", "axis", "grid", "tpe", "random"]
Pruner = Literal["median", "halving", "none"]
SAMPLERS, PRUNERS = typing.get_args(Sampler), typing.get_args(Pruner)
DEFAULT_TRIALS = 12  # per method, when the sampler is not a grid (a grid defaults to all its combinations)
MAX_POINTS = 1000  # values of one log:LO:HI:N axis, and trials per method: each trial is a whole training run
MAX_TUNE_EPOCHS = 10_000  # epochs of one trial
TUNE_SYNTAX = ("expected SECTION.KEY=V1,V2,..., SECTION.KEY=LO:HI, SECTION.KEY=log:LO:HI or SECTION.KEY=log:LO:HI:N, "
               "e.g. optim.lr=log:1e-3:1e-2")


@dataclass(frozen=True)
class Param:
    """One tuned field: a list of `values`, or a range [`low`, `high`] (`log`: sampled on a log scale);
    `integer` once the plan knows the field takes whole numbers."""

    field: str
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @property
    def is_list(self) -> bool:
        return bool(self.values)

    def describe(self) -> str:
        """'optim.lr in log [0.001, 0.01]' or 'method.tau in {8, 16, 32}'."""
        if self.is_list:
            return f"{self.field} in {{{', '.join(show(v) for v in self.values)}}}"
        return f"{self.field} in {'log ' if self.log else ''}[{show(self.low)}, {show(self.high)}]"

    def extremes(self) -> tuple:
        """The values a plan checks before anything runs: every listed value, or both ends of the range."""
        return self.values if self.is_list else (self.low, self.high)

    def as_integers(self) -> Param:
        """This parameter over whole numbers (values and ends must be whole)."""
        numbers = self.values if self.is_list else (self.low, self.high)
        require(all(float(v).is_integer() for v in numbers), "--tune", self.field,
                f"an integer field; {', '.join(show(v) for v in numbers)} are not all whole numbers")
        if self.is_list:
            return replace(self, values=tuple(dict.fromkeys(int(v) for v in self.values)), integer=True)
        return replace(self, low=int(self.low or 0), high=int(self.high or 0), integer=True)

    def as_floats(self) -> Param:
        return replace(self, values=tuple(float(v) for v in self.values)) if self.is_list else self


@dataclass(frozen=True)
class Tune:
    """A search: its parameters, each trial's `epochs` (None: the full count), `trials` per method (None:
    the grid's size, or DEFAULT_TRIALS), the `sampler` and its `seed`, the `pruner`, and `train_seed`, the
    training seed of every trial (None: the comparison's first seed)."""

    params: tuple[Param, ...]
    epochs: int | None = opt(None, "epochs of each trial", bounds=f"[1, {MAX_TUNE_EPOCHS}]", also=(None,),
                             note=" (epochs of each trial, each a training run)", name="--tune-epochs")
    trials: int | None = opt(None, "trials per method", bounds=f"[1, {MAX_POINTS}]", also=(None,),
                             note=" (trials per method, each a training run)", name="--tune-trials")
    sampler: Sampler = opt("auto", "the sampler of each method's search", name="--tune-sampler")
    seed: int = opt(0, "the samplers' seed", bounds=f"[0, {2**32})", note=" (the samplers' seed)", name="--tune-seed")
    pruner: Pruner = opt("median", "stops trials that fall behind", name="--tune-pruner")
    train_seed: int | None = opt(None, "the training seed of every trial", bounds=f"[0, {2**32})", also=(None,),
                                 note=" (the training seed of every trial)", name="--tune-on")

    def __post_init__(self):
        check_bounds(self, "tune")
        require(self.sampler not in ("grid", "axis") or all(p.is_list for p in self.params), "--tune-sampler",
                self.sampler, f"{'a grid' if self.sampler == 'grid' else 'the axis search'} needs every --tune "
                "field as a list (V1,V2,... or log:LO:HI:N)")

    @property
    def fields(self) -> list[str]:
        return [p.field for p in self.params]

    def param(self, field: str) -> Param:
        return next(p for p in self.params if p.field == field)

    def is_grid(self, fields: list[str] | None = None) -> bool:
        """Grid sampling (every combination): only when asked for with --tune-sampler grid."""
        return self.sampler == "grid"

    def sampler_name(self, fields: list[str] | None = None) -> str:
        """The sampler of a method tuning `fields` (default: all): as asked, or (auto) the axis search when
        every field is a list (lowband.comparison.axis), TPE when one is a range."""
        if self.sampler != "auto":
            return self.sampler
        chosen = [self.param(f) for f in fields] if fields is not None else list(self.params)
        return "axis" if all(p.is_list for p in chosen) else "tpe"

    def trial_count(self, fields: list[str]) -> int:
        """Trials for a method tuning `fields`: --tune-trials (default: the combinations for the grid and the
        axis search, which stops sooner by itself; else DEFAULT_TRIALS), never more than the combinations when
        every field is a list (more would repeat one)."""
        lists = all(self.param(f).is_list for f in fields)
        size = math.prod(len(self.param(f).values) for f in fields) if lists else None
        if self.trials is not None:
            wanted = self.trials
        else:  # the axis search stops by itself at a local optimum (lowband.comparison.axis), the grid when spent
            wanted = size if size and (self.is_grid(fields) or self.sampler_name(fields) == "axis") else DEFAULT_TRIALS
        return min(wanted, size) if size else wanted

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> Tune:
        """A plan.json's tune; an older one-field grid ({field, values, epochs}) reads as one list."""
        if "params" not in data:
            return Tune((Param(data["field"], tuple(data["values"])),), data.get("epochs"), sampler="grid",
                        pruner="none")
        params = tuple(Param(**{**p, "values": tuple(p["values"])}) for p in data["params"])
        return Tune(params, **{k: v for k, v in data.items() if k != "params"})


def show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_tune(texts: list[str] | str, epochs: int | None = None, trials: int | None = None,
               sampler: str = "auto", seed: int = 0, pruner: str = "median", train_seed: int | None = None) -> Tune:
    """Each `--tune FIELD=SPEC` -> a Tune (a field at most once); the options checked."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    params = tuple(parse_param(text) for text in texts)
    fields = [p.field for p in params]
    require(len(set(fields)) == len(fields), "--tune", " ".join(texts), "each field at most once")
    return Tune(params, epochs, trials, sampler, seed, pruner, train_seed)  # type: ignore[arg-type]


PARAM = re.compile(r"\s*(?P<field>[^=.\s]+\.[^=.\s]+)\s*=\s*(?:(?P<log>log:)?(?P<lo>[^:,]+):(?P<hi>[^:,]+)"
                   r"(?::(?P<n>[^:,]*))?|(?P<values>[^:]+))\s*")  # TUNE_SYNTAX


def parse_param(text: str) -> Param:
    """'optim.lr=0.05,0.1', 'optim.lr=log:0.01:0.1:3', 'method.outer_lr=0.3:1.0', 'optim.lr=log:1e-3:1e-2'."""
    m = PARAM.fullmatch(text)
    require(m is not None and (bool(m["log"]) or m["n"] is None), "--tune", text, TUNE_SYNTAX)
    assert m is not None
    if m["values"] is not None:
        return Param(m["field"], tuple(dict.fromkeys(number(text, v) for v in m["values"].split(","))))
    low, high, log = number(text, m["lo"]), number(text, m["hi"]), bool(m["log"])
    why = f"{show(low)} is not above 0" if log and low <= 0 else f"{show(low)} is not below {show(high)}"
    require(low < high and (low > 0 or not log), "--tune", text,
            f"a {'log range needs 0 < LO < HI' if log else 'range LO:HI needs LO < HI'}; {why}")
    if m["n"] is None:
        return Param(m["field"], low=low, high=high, log=log)
    n = m["n"].strip()
    require(n.isascii() and n.isdigit() and 2 <= int(n) <= MAX_POINTS, "--tune", text,
            f"log:LO:HI:N needs an integer N in [2, {MAX_POINTS}] (each value is a training run)")
    return Param(m["field"], tuple(dict.fromkeys(log_values(low, high, int(n)))))


def number(text: str, item: str) -> float:
    try:
        value = float(item.strip())
    except ValueError:
        value = math.nan
    require(math.isfinite(value), "--tune", text, f"{item.strip()!r} is not a number; {TUNE_SYNTAX}")
    return value


def log_values(lo: float, hi: float, n: int) -> list[float]:
    """N values from LO to HI evenly spaced on a log scale (4 significant digits)."""
    return [float(f"{lo * (hi / lo) ** (i / (n - 1)):.4g}") for i in range(n)]
