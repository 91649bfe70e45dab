"""What a comparison runs, decided and checked before anything runs (lowband.comparison.runner runs it).

A comparison is a list of method specs (`allreduce`, `local_sgd:tau=16`), each resolved to one
raw config: defaults <- the suite's [config] <- the suite's [per_method.NAME] and
[per_method."NAME:OPTIONS"] tables <- command-line flags and --set. From the specs the plan
derives its runs:

- tuning runs (`--tune FIELD=VALUES`, `--tune-epochs N`): every spec at every value, N epochs,
  the first seed; per spec the value with the best final validation accuracy is chosen;
- full runs: every spec once per seed (`--seeds 0,1,2`), with its chosen value.

Budgets (`--budget`): `epochs` (the default) gives every method train.epochs passes over its
own worker's data; `steps` gives every worker as many optimizer steps, and `samples` all
workers together as many training samples, as Allreduce takes in train.epochs epochs on the
comparison's workers and data. A method's epochs (tuning runs' too) are scaled to match,
rounded to whole epochs (at least 1); the table's `samples` column shows what each processed.

The plan's inputs are saved as plan.json in the comparison directory, and every finished run is
recorded in done.jsonl there (lowband.comparison.folder), so that `compare --resume DIR` re-plans
the same runs and skips the finished ones. Nothing here starts a run.
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from dataclasses import asdict, dataclass

from lowband import config as C
from lowband.data.metric import ACCURACY, Metric
from lowband.errors import ConfigError, require

TUNE_DIR = "tune"
BUDGETS = ("epochs", "steps", "samples")


# ---- parsing ---------------------------------------------------------------------------------
def parse_spec(spec: str) -> tuple[str, dict]:
    """'ec_dnn:ensemble=margin:tau=128' -> ('ec_dnn', {'ensemble': 'margin', 'tau': 128}).

    A value may hold colons ('diloco:codec=topk:0.02+int2:tau=64'): a new option starts only at
    ':KEY='."""
    name, *options = re.split(r":(?=[A-Za-z_][A-Za-z0-9_]*=)", spec)
    if ":" in name:
        raise ConfigError("--methods", spec, "options are NAME:KEY=VALUE[:KEY=VALUE], e.g. ec_dnn:ensemble=margin")
    values = {}
    for item in options:
        path, value = C.parse_set(f"method.{item}")
        if len(path) != 2:
            raise ConfigError("--methods", spec, "options are KEY=VALUE, e.g. ec_dnn:ensemble=margin")
        values[path[1]] = value
    return name, values


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]: distinct integers >= 0."""
    allowed = "a comma-separated list of distinct integers >= 0, e.g. 0,1,2"
    items = [item.strip() for item in text.split(",")]
    require(all(item.isdigit() for item in items), "--seeds", text, allowed)
    seeds = [int(item) for item in items]
    require(len(set(seeds)) == len(seeds), "--seeds", text, allowed)
    return seeds


@dataclass(frozen=True)
class Tune:
    """A tuning sweep: `field` (SECTION.KEY) at each of `values`, runs of `epochs` epochs (None: the full count)."""

    field: str
    values: tuple
    epochs: int | None = None


TUNE_SYNTAX = "expected SECTION.KEY=V1,V2,... or SECTION.KEY=log:LO:HI:N, e.g. optim.lr=0.025,0.05,0.1"


def parse_tune(text: str, epochs: int | None = None) -> Tune:
    """'optim.lr=0.05,0.1' or 'optim.lr=log:0.01:0.1:3' -> Tune (values as numbers, in order, distinct)."""
    field, sep, values = (part.strip() for part in text.partition("="))
    require(bool(sep) and bool(values) and len(field.split(".")) == 2 and all(field.split(".")),
            "--tune", text, TUNE_SYNTAX)
    require(epochs is None or epochs >= 1, "--tune-epochs", epochs, "must be >= 1")
    numbers = log_values(text, values) if values.startswith("log:") else [number(text, v) for v in values.split(",")]
    return Tune(field, tuple(dict.fromkeys(numbers)), epochs)


def number(text: str, item: str) -> float:
    try:
        value = float(item.strip())
    except ValueError:
        value = math.nan
    require(math.isfinite(value), "--tune", text, f"{item.strip()!r} is not a number; {TUNE_SYNTAX}")
    return value


def log_values(text: str, spec: str) -> list[float]:
    """'log:LO:HI:N' -> N values from LO to HI evenly spaced on a log scale (4 significant digits)."""
    parts = spec.split(":")[1:]
    require(len(parts) == 3, "--tune", text, "log spacing is log:LO:HI:N, e.g. log:0.01:0.2:5")
    lo, hi = number(text, parts[0]), number(text, parts[1])
    require(parts[2].strip().isdigit() and int(parts[2]) >= 2, "--tune", text, "log:LO:HI:N needs an integer N >= 2")
    require(0 < lo < hi, "--tune", text, "log:LO:HI:N needs 0 < LO < HI")
    n = int(parts[2])
    return [float(f"{lo * (hi / lo) ** (i / (n - 1)):.4g}") for i in range(n)]


def fill(raw, folder: str):
    """`raw` with "{folder}" replaced in every string."""
    if isinstance(raw, dict):
        return {k: fill(v, folder) for k, v in raw.items()}
    if isinstance(raw, list):
        return [fill(v, folder) for v in raw]
    return raw.replace("{folder}", folder) if isinstance(raw, str) else raw


# ---- one spec's config -----------------------------------------------------------------------
def spec_config(spec: str, base: dict, overrides: dict, per_method: dict | None = None,
                method_defaults: dict | None = None, inherit: bool = False) -> dict:
    """The raw config of one method spec: `base` (the suite's [config]) <- its per-method settings
    (the method name's table, then the whole spec's) <- `overrides` (command line). The [method]
    table: `method_defaults` for the name <- per-method [method] <- `base`/`overrides` [method]
    options when `inherit` (the first spec's name) <- the spec's own options."""
    name, options = parse_spec(spec)
    per_method = per_method or {}
    settings = C.merge(per_method.get(name, {}), per_method.get(spec, {}) if spec != name else {})
    raw = C.merge(C.merge(base, {k: v for k, v in settings.items() if k != "method"}), overrides)
    inherited = C.merge(base.get("method", {}), overrides.get("method", {})) if inherit else {}
    inherited.pop("name", None)
    raw["method"] = {**(method_defaults or {}).get(name, {}), **settings.get("method", {}), **inherited, **options,
                     "name": name}
    return raw


def set_field(raw: dict, field: str, value) -> dict:
    """A copy of `raw` with SECTION.KEY = value."""
    return C.merge(raw, C.nest(field.split("."), value))


def field_type(field: str, raw: dict, method_configs: dict[str, type]):
    """The declared type of SECTION.KEY in `raw`'s config; ConfigError when there is no such field."""
    section, key = field.split(".")
    cls = method_configs.get(raw["method"]["name"]) if section == "method" else C.SECTIONS.get(section)
    require(cls is not None, "--tune", field, "unknown section; known: method, " + ", ".join(C.SECTIONS))
    hints = typing.get_type_hints(cls)
    where = f"method {raw['method']['name']}" if section == "method" else f"[{section}]"
    known = [k for k in hints if section != "method" or k != "name"]
    require(key in known, "--tune", field, f"{where} has no field {key!r}; known: {', '.join(known)}")
    return hints[key]


def numeric_kind(tp) -> type | None:
    """int or float when a field of type `tp` takes numbers (float preferred), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        kinds = {numeric_kind(arg) for arg in typing.get_args(tp)} - {None}
        return float if float in kinds else (int if int in kinds else None)
    return tp if tp in (int, float) else None


def typed_values(tune: Tune, kind: type) -> tuple:
    """The sweep's values as `kind`: integers stay whole (an integer field takes no fractions)."""
    if kind is float:
        return tuple(float(v) for v in tune.values)
    require(all(float(v).is_integer() for v in tune.values), "--tune", tune.field,
            f"an integer field; values {', '.join(f'{v:g}' for v in tune.values)} are not all whole")
    return tuple(dict.fromkeys(int(v) for v in tune.values))


# ---- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run of the plan: `key` names it in done.jsonl, `dir` is relative to the comparison directory."""

    key: str
    label: str
    kind: str  # "tune" or "run"
    seed: int
    dir: str
    config: dict
    value: float | int | None = None
    field: str | None = None  # the tuned field, when `value` is set

    @property
    def tuned(self) -> str:
        """'optim.lr=0.1', or '' when nothing was tuned."""
        return "" if self.value is None else f"{self.field}={show(self.value)}"


@dataclass
class Plan:
    """The inputs of a comparison: one resolved raw config per spec (label), seeds, sweep, preparation."""

    labels: list[str]
    configs: dict[str, dict]
    seeds: list[int] | None = None
    tune: Tune | None = None
    prepare: list[str] | None = None
    budget: str = "epochs"
    scale: dict[str, float] | None = None  # per label: its epochs over train.epochs (the budget's)

    def epochs(self, label: str, epochs: int) -> int:
        """`epochs` scaled to the label's share of the budget: whole epochs, at least 1."""
        return max(1, round(epochs * (self.scale or {}).get(label, 1.0)))

    def to_json(self) -> dict:
        return {"version": 1, **asdict(self), "tune": asdict(self.tune) if self.tune else None}

    @staticmethod
    def from_json(data: dict) -> Plan:
        tune = data.get("tune")
        return Plan(data["labels"], data["configs"], data.get("seeds"),
                    Tune(tune["field"], tuple(tune["values"]), tune.get("epochs")) if tune else None,
                    data.get("prepare") or [], data.get("budget", "epochs"), data.get("scale"))


def make_plan(specs: list[str], base: dict, overrides: dict, folder: str, *, seeds: list[int] | None = None,
              tune: Tune | None = None, suite: dict | None = None, budget: str = "epochs", layout=None) -> Plan:
    """Resolve and check every run before any starts: each spec's config, each seed and tuned value,
    each run's shape (lowband.run.spec.resolve); a bad value raises ConfigError/UsageError.

    `suite`: a suite's `prepare` commands, `per_method` settings and `method_defaults`; `layout(config)`
    -> (optimizer steps per epoch per worker, workers) sizes a `steps` or `samples` budget (default:
    the workers' real data, `steps_layout`)."""
    from lowband.run.runconfig import method_configs as known_methods
    from lowband.run.spec import resolve

    method_configs = known_methods()
    suite = suite or {}
    prepare, per_method, method_defaults = suite.get("prepare"), suite.get("per_method"), suite.get("method_defaults")
    layout = layout or steps_layout
    require(len(set(specs)) == len(specs), "--methods", ",".join(specs), "each method spec at most once")
    for key in per_method or {}:
        require(parse_spec(key)[0] in method_configs, f"per_method.{key}", (per_method or {})[key],
                "names no method; known: " + ", ".join(sorted(method_configs)))
    first = parse_spec(specs[0])[0]
    configs = {spec: fill(spec_config(spec, base, overrides, per_method, method_defaults,
                                      inherit=parse_spec(spec)[0] == first), folder) for spec in specs}
    require(budget in BUDGETS, "--budget", budget, "one of " + ", ".join(BUDGETS))
    plan = Plan(list(specs), configs, seeds, None, list(prepare or []), budget)
    if budget != "epochs":
        reference = C.from_dict(spec_config("allreduce", base, overrides), method_configs)
        plan.scale = {label: budget_scale(budget, layout, reference, C.from_dict(raw, method_configs))
                      for label, raw in configs.items()}
    if tune is not None:
        kinds = {numeric_kind(field_type(tune.field, raw, method_configs)) for raw in configs.values()}
        require(None not in kinds, "--tune", tune.field, "not a numeric field; tune a number, e.g. optim.lr")
        plan.tune = Tune(tune.field, typed_values(tune, float if float in kinds else int), tune.epochs)
    for run in tuning_runs(plan) + full_runs(plan, {}):
        resolve(C.from_dict(run.config, method_configs))
    return plan


def steps_layout(cfg: C.Config) -> tuple[int, int]:
    """(optimizer steps per epoch of each worker, workers) of a config: what a budget is measured in."""
    from lowband.run.spec import resolve
    from lowband.run.trainer import worker_data

    world = resolve(cfg).world
    return worker_data(cfg, world).steps, world


def budget_scale(budget: str, layout, reference: C.Config, cfg: C.Config) -> float:
    """`cfg`'s epochs per epoch of `reference` (Allreduce) under `budget`: the ratio of what one epoch
    gives each worker (`steps`: optimizer steps) or all workers together (`samples`: steps x batch x workers)."""
    def per_epoch(c: C.Config) -> float:
        steps, workers = layout(c)
        return steps if budget == "steps" else steps * c.train.batch_size * workers

    return per_epoch(reference) / per_epoch(cfg)


def safe(label: str) -> str:
    """A label as a directory name: 'local_sgd:tau=16' -> 'local_sgd_tau-16'."""
    return label.replace(":", "_").replace("=", "-").replace("/", "-")


def show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def tuning_runs(plan: Plan) -> list[Run]:
    """Every spec at every tuned value: the first seed, `tune.epochs` epochs."""
    if plan.tune is None:
        return []
    field, out = plan.tune.field, []
    for label in plan.labels:
        raw = plan.configs[label]
        seed = plan.seeds[0] if plan.seeds else raw.get("train", {}).get("seed", 0)
        for value in plan.tune.values:
            cfg = set_field(set_field(raw, field, value), "train.seed", seed)
            epochs = plan.tune.epochs if plan.tune.epochs is not None else train_epochs(cfg)
            cfg = set_field(cfg, "train.epochs", plan.epochs(label, epochs))
            name = f"{safe(label)}_{field}-{show(value)}"
            out.append(Run(f"tune/{label}/{field}={show(value)}", label, "tune", seed,
                           os.path.join(TUNE_DIR, name), cfg, value, field))
    return out


def full_runs(plan: Plan, chosen: dict[str, float | int | None]) -> list[Run]:
    """Every spec once per seed (seed-major: one whole comparison per seed), with its chosen value."""
    seeds: list[int | None] = list(plan.seeds) if plan.seeds else [None]
    field = plan.tune.field if plan.tune is not None else None
    out = []
    for seed in seeds:
        for label in plan.labels:
            raw, value = plan.configs[label], chosen.get(label)
            if value is not None and field is not None:
                raw = set_field(raw, field, value)
            if seed is not None:
                raw = set_field(raw, "train.seed", seed)
            if plan.budget != "epochs":
                raw = set_field(raw, "train.epochs", plan.epochs(label, train_epochs(raw)))
            suffix = f"_seed-{seed}" if len(seeds) > 1 else ""
            key = f"run/{label}" + (f"/seed={seed}" if seed is not None else "")
            out.append(Run(key, label, "run", raw.get("train", {}).get("seed", 0), safe(label) + suffix, raw,
                           value if field is not None else None, field))
    return out


def train_epochs(raw: dict) -> int:
    return raw.get("train", {}).get("epochs", C.TrainConfig().epochs)


def choose(results: list[tuple[Run, float | None]], metric: Metric = ACCURACY) -> dict[str, float | int | None]:
    """Per label, the tuned value with the best validation figure of the workload's metric (ties: the first
    tried; None: none finished)."""
    best: dict[str, tuple[float, float | int | None] | None] = {}
    for run, value in results:
        current = best.setdefault(run.label, None)
        if value is not None and (current is None or metric.better(value, current[0])):
            best[run.label] = (value, run.value)
    return {label: None if b is None else b[1] for label, b in best.items()}
