"""What a comparison runs, decided and checked before anything runs (lowband.comparison.runner runs it).

A comparison is a list of method specs (`allreduce`, `local_sgd:tau=16`), each resolved to one
raw config: defaults <- the suite's [config] <- the suite's [per_method.NAME] and
[per_method."NAME:OPTIONS"] tables <- command-line flags and --set. From the specs the plan
derives its runs:

- tuning trials (`--tune FIELD=SPEC`, repeatable; lowband.comparison.space): per spec, a search over the
  fields it has, `--tune-trials` trials of `--tune-epochs` epochs at the first seed (or `--tune-on`'s: a
  seed outside `--seeds` keeps choosing and judging apart); which values each
  trial runs is the sampler's choice at run time (lowband.comparison.tuning), so the plan checks every
  field at its extremes; per spec the finished trial with the best final validation figure is chosen;
- full runs: every spec once per seed (`--seeds 0,1,2`), with its chosen values.

Budgets (`--budget`): `epochs` (the default) gives every method train.epochs passes over its
own worker's data; `steps` gives every worker as many optimizer steps, and `samples` all
workers together as many training samples, as Allreduce takes in train.epochs epochs on the
comparison's workers and data. A method's epochs (tuning runs' too) are scaled to match,
rounded to whole epochs (at least 1); the table's `samples` column shows what each processed.
`target[:FACTOR]`: the reference (the suite's target method, Allreduce by default) runs first with
train.epochs; every other method may train up to FACTOR (default 4) times its training samples and stops
at the first epoch whose validation figure reaches the reference's final one (within the metric's
margin; `aim`). Its learning-rate schedule is planned over that cap: a schedule planned over the
reference's epochs would have decayed to 0 by then, leaving nothing to train with past it. Tuning
trials under a target budget get the reference's samples (as `samples`).

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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from lowband import config as C
from lowband.comm.placement import here
from lowband.comparison.space import Tune, show
from lowband.data.metric import Metric
from lowband.errors import ConfigError, require
from lowband.training import runconfig
from lowband.training.spec import resolve

TUNE_DIR = "tune"
BUDGETS = ("epochs", "steps", "samples", "target")
DEFAULT_FACTOR = 4.0  # a target budget's cap: this many times the reference's samples
REFERENCE = "allreduce"  # a target budget's reference, unless the suite names another (its `target`)


# ---- parsing ---------------------------------------------------------------------------------
def parse_spec(spec: str, field: str = "--methods") -> tuple[str, dict]:
    """'ec_dnn:ensemble=margin:tau=128' -> ('ec_dnn', {'ensemble': 'margin', 'tau': 128}); a malformed one is a
    ConfigError naming `field` (the flag or argument that gave it).

    A value may hold colons ('diloco:codec=topk:0.02+int2:tau=64'): a new option starts only at
    ':KEY='."""
    name, *options = re.split(r":(?=[A-Za-z_][A-Za-z0-9_]*=)", spec)
    if ":" in name:
        raise ConfigError(field, spec, "options are NAME:KEY=VALUE[:KEY=VALUE], e.g. ec_dnn:ensemble=margin")
    values = {}
    for item in options:
        path, value = C.parse_set(f"method.{item}")
        if len(path) != 2:
            raise ConfigError(field, spec, "options are KEY=VALUE, e.g. ec_dnn:ensemble=margin")
        values[path[1]] = value
    return name, values


MAX_RUNS_LISTED = 100  # seeds, or method specs, in one comparison: each is a whole training run of every other


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]: distinct seeds, at most MAX_RUNS_LISTED."""
    allowed = f"a comma-separated list of at most {MAX_RUNS_LISTED} distinct integers in 0..{C.MAX_SEED}, e.g. 0,1,2"
    items = [item.strip() for item in text.split(",")]
    seeds = [int(item) if item.isascii() and item.isdigit() else -1 for item in items]
    require(min(seeds) >= 0 and max(seeds) <= C.MAX_SEED and len(set(seeds)) == len(seeds) <= MAX_RUNS_LISTED,
            "--seeds", shown(text), allowed)
    return seeds


def shown(text: str) -> str:
    """A list the user gave, cut to 60 characters for a one-line refusal."""
    return text if len(text) <= 60 else text[:57] + "..."


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


def has_field(field: str, raw: dict, method_configs: dict[str, type]) -> bool:
    """Whether `raw`'s method has a `method.KEY` field (fields of other sections: every config has them)."""
    section, key = field.split(".")
    cls = method_configs.get(raw["method"]["name"])
    return section != "method" or (cls is not None and key in typing.get_type_hints(cls) and key != "name")


def numeric_kind(tp) -> type | None:
    """int or float when a field of type `tp` takes numbers (float preferred), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        kinds = {numeric_kind(arg) for arg in typing.get_args(tp)} - {None}
        return float if float in kinds else (int if int in kinds else None)
    return tp if tp in (int, float) else None


def resolve_tune(tune: Tune, configs: dict[str, dict], method_configs: dict[str, type]) -> tuple[Tune, dict]:
    """(`tune` with each field's number kind settled, the fields each label tunes): a `method.*` field
    applies to the methods that have it; a field no method has, or one that takes no number, is refused."""
    params: list = []
    tuned: dict[str, list[str]] = {label: [] for label in configs}
    for param in tune.params:
        having = [label for label, raw in configs.items() if has_field(param.field, raw, method_configs)]
        numeric_fields = sorted({k for raw in configs.values() if raw["method"]["name"] in method_configs
                                 for k, tp in typing.get_type_hints(method_configs[raw["method"]["name"]]).items()
                                 if numeric_kind(tp)})
        require(bool(having), "--tune", param.field, "no method of this comparison has that field; their numeric "
                                                      "method fields: " + ", ".join(numeric_fields))
        kinds = {numeric_kind(field_type(param.field, configs[label], method_configs)) for label in having}
        require(None not in kinds, "--tune", param.field, "not a numeric field; tune a number, e.g. optim.lr")
        params.append(param.as_floats() if float in kinds else param.as_integers())
        for label in having:
            tuned[label].append(param.field)
    return replace(tune, params=tuple(params)), tuned


MAX_FACTOR = 100.0  # a target budget's cap: at most this many times the reference's samples


def parse_budget(text: str) -> tuple[str, float]:
    """'samples' -> ('samples', 1.0); 'target' -> ('target', 4.0); 'target:2' -> ('target', 2.0)."""
    name, colon, factor = text.partition(":")
    allowed = f"epochs, steps, samples or target[:FACTOR] (1 <= FACTOR <= {MAX_FACTOR:g}, default 4)"
    require(name in BUDGETS and (not colon or name == "target"), "--budget", text, allowed)
    require(not colon or factor.strip() != "", "--budget", text, f"FACTOR after 'target:' is empty; {allowed}")
    try:
        value = float(factor) if factor else (DEFAULT_FACTOR if name == "target" else 1.0)
    except ValueError:
        value = math.nan
    require(math.isfinite(value) and 1 <= value <= MAX_FACTOR, "--budget", text, f"FACTOR must be a number in "
            f"[1, {MAX_FACTOR:g}]; {allowed}")
    return name, value


# ---- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run of the plan: `key` names it in done.jsonl, `dir` is relative to the comparison directory;
    `config` its typed config, parsed once here (what the runner starts and the tuner watches);
    `values` the tuned fields' values (None: nothing tuned)."""

    key: str
    label: str
    kind: str  # "tune" or "run"
    seed: int
    dir: str
    config: C.Config
    values: dict | None = None

    @property
    def tuned(self) -> str:
        """'optim.lr=0.1 method.tau=16', or '' when nothing was tuned."""
        return " ".join(f"{field}={show(value)}" for field, value in (self.values or {}).items())


@dataclass
class Plan:
    """The inputs of a comparison: one resolved raw config per spec (label), seeds, search, preparation,
    budget (`factor`: a target budget's cap over the reference's samples; `reference`: its label), and
    per label the fields it tunes (`tuned`)."""

    labels: list[str]
    configs: dict[str, dict]
    seeds: list[int] | None = None
    tune: Tune | None = None
    prepare: list[str] | None = None
    budget: str = "epochs"
    scale: dict[str, float] | None = None  # per label: its epochs over train.epochs (the budget's)
    tuned: dict[str, list[str]] | None = None
    factor: float = 1.0
    reference: str | None = None

    def epochs(self, label: str, epochs: int) -> int:
        """`epochs` scaled to the label's share of the budget: whole epochs, at least 1."""
        return max(1, round(epochs * (self.scale or {}).get(label, 1.0)))

    def cap(self, label: str, epochs: int) -> int:
        """A full run's epochs: its budget's; under a target budget FACTOR x the reference's samples
        (rounded up) for every label but the reference."""
        if self.budget != "target" or label == self.reference:
            return self.epochs(label, epochs)
        return max(1, math.ceil(epochs * (self.scale or {}).get(label, 1.0) * self.factor - 1e-9))

    def config(self, label: str) -> C.Config:
        """`label`'s typed config (the plan keeps raw ones: they are what plan.json saves)."""
        return typed(self.configs[label])

    def to_json(self) -> dict:
        return {"version": 2, **asdict(self), "tune": self.tune.to_json() if self.tune else None}

    @staticmethod
    def from_json(data: dict) -> Plan:
        tune = data.get("tune")
        return Plan(data["labels"], data["configs"], data.get("seeds"), Tune.from_json(tune) if tune else None,
                    data.get("prepare") or [], data.get("budget", "epochs"), data.get("scale"),
                    data.get("tuned") or ({label: [tune["field"]] for label in data["labels"]} if tune else None),
                    data.get("factor", 1.0), data.get("reference"))


def make_plan(specs: list[str], base: dict, overrides: dict, folder: str, *, seeds: list[int] | None = None,
              tune: Tune | None = None, suite: dict | None = None, budget: str = "epochs", layout=None) -> Plan:
    """Resolve and check every run before any starts: each spec's config, each seed, each tuned field at
    its extremes, each run's shape (lowband.training.spec.resolve) and its device and backend on this machine
    (lowband.comm.placement); a bad value raises ConfigError/UsageError.

    `suite`: a suite's `prepare` commands, `per_method` settings, `method_defaults` and `target` (the
    reference of a target budget); `layout(config)` -> (optimizer steps per epoch per worker, workers)
    sizes a `steps`, `samples` or `target` budget (default: the workers' real data, `steps_layout`)."""
    method_configs = runconfig.method_configs()
    suite = suite or {}
    prepare, per_method, method_defaults = suite.get("prepare"), suite.get("per_method"), suite.get("method_defaults")
    layout = layout or steps_layout
    require(len(set(specs)) == len(specs) <= MAX_RUNS_LISTED, "--methods", f"{len(specs)} specs: {shown(','.join(specs))}",
            f"at most {MAX_RUNS_LISTED} specs, each once (each is a training run per seed)")
    for key in per_method or {}:
        require(parse_spec(key)[0] in method_configs, f"per_method.{key}", (per_method or {})[key],
                "names no method; known: " + ", ".join(sorted(method_configs)))
    first = parse_spec(specs[0])[0]
    configs = {spec: fill(spec_config(spec, base, overrides, per_method, method_defaults,
                                      inherit=parse_spec(spec)[0] == first), folder) for spec in specs}
    name, factor = parse_budget(budget)
    plan = Plan(list(specs), configs, seeds, None, list(prepare or []), name, factor=factor)
    plan.reference = reference_label(specs, suite.get("target"), name == "target")
    if name != "epochs":
        sized_on = configs[plan.reference] if name == "target" and plan.reference else None  # else Allreduce's
        reference = C.from_dict(sized_on or spec_config(REFERENCE, base, overrides),
                                method_configs)
        plan.scale = {label: budget_scale("samples" if name == "target" else name, layout, reference,
                                          C.from_dict(raw, method_configs)) for label, raw in configs.items()}
    if tune is not None:
        plan.tune, plan.tuned = resolve_tune(tune, configs, method_configs)
    for cfg in [run.config for run in full_runs(plan, {})] + extreme_configs(plan):
        here(cfg.train.device, cfg.train.backend, resolve(cfg).world)  # e.g. train.device=cuda without CUDA
    return plan


def reference_label(specs: list[str], target: str | None, needed: bool) -> str | None:
    """The comparison's reference: the first spec of the suite's `target` method (None: Allreduce), whose
    final validation figure is the target (table, report, target budget). None when it is not in the
    comparison, which a target budget (`needed`) refuses, naming the key that chose it."""
    method = target or REFERENCE
    label = next((spec for spec in specs if parse_spec(spec)[0] == method), None)
    if label is None and needed and method != REFERENCE:  # a suite's own choice: blame its key
        raise ConfigError("target", target, f"is the suite's reference method, which --budget target measures its "
                                            f"target on, but it is not in this comparison ({', '.join(specs)}): add "
                                            f"{target} to --methods")
    require(label is not None or not needed, "--budget", "target", f"needs the reference method {method} in the "
                                                                   f"comparison (it sets the target); add {method} to "
                                                                   "--methods, or name another in the suite's target")
    return label


def steps_layout(cfg: C.Config) -> tuple[int, int]:
    """(optimizer steps per epoch of each worker, workers) of a config: what a budget is measured in."""
    from lowband.training.trainer import worker_data  # torch and the data sets: only a budget's sizing needs them

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


# ---- tuning trials and full runs -------------------------------------------------------------
def trial_run(plan: Plan, label: str, number: int, values: dict, directory: str | None = None) -> Run:
    """Trial `number` of `label`'s search at `values`: the tuning seed (`tuning_seed`), `tune.epochs` epochs
    (the budget's share), in tune/LABEL/trial-NNN (or `directory`: a retried trial continues its
    predecessor's)."""
    assert plan.tune is not None
    raw = plan.configs[label]
    seed = tuning_seed(plan, raw)
    cfg = set_field(raw, "train.seed", seed)
    for field, value in values.items():
        cfg = set_field(cfg, field, value)
    epochs = plan.tune.epochs if plan.tune.epochs is not None else train_epochs(cfg)
    cfg = set_field(cfg, "train.epochs", plan.epochs(label, epochs))
    where = directory or os.path.join(TUNE_DIR, safe(label), f"trial-{number:03d}")
    return Run(f"tune/{label}/{number}", label, "tune", seed, where, typed(cfg), dict(values))


def tuning_seed(plan: Plan, raw: Mapping | None = None) -> int:
    """The training seed of every tuning trial: --tune-on's, else the comparison's first seed (else the
    config's train.seed)."""
    assert plan.tune is not None
    if plan.tune.train_seed is not None:
        return plan.tune.train_seed
    return plan.seeds[0] if plan.seeds else (raw or {}).get("train", {}).get("seed", 0)


def extreme_configs(plan: Plan) -> list[C.Config]:
    """Each label's trial config with one tuned field at each of its extremes (what a plan checks)."""
    if plan.tune is None:
        return []
    out = []
    for label, fields in (plan.tuned or {}).items():
        for field in fields:
            out += [trial_run(plan, label, 0, {field: v}).config for v in plan.tune.param(field).extremes()]
    return out


def full_runs(plan: Plan, chosen: Mapping[str, dict | None]) -> list[Run]:
    """Every spec once per seed (seed-major: one whole comparison per seed), with its chosen values; under
    a target budget the reference runs first in each seed and the others stop at its target (`aim`)."""
    seeds: list[int | None] = list(plan.seeds) if plan.seeds else [None]
    labels = list(plan.labels)
    if plan.budget == "target" and plan.reference is not None:
        labels = [plan.reference] + [label for label in labels if label != plan.reference]
    out = []
    for seed in seeds:
        for label in labels:
            raw, values = plan.configs[label], chosen.get(label)
            for field, value in (values or {}).items():
                raw = set_field(raw, field, value)
            if seed is not None:
                raw = set_field(raw, "train.seed", seed)
            if plan.budget != "epochs":
                raw = set_field(raw, "train.epochs", plan.cap(label, train_epochs(raw)))
            suffix = f"_seed-{seed}" if len(seeds) > 1 else ""
            key = f"run/{label}" + (f"/seed={seed}" if seed is not None else "")
            cfg = typed(raw)
            out.append(Run(key, label, "run", cfg.train.seed, safe(label) + suffix, cfg,
                           dict(values) if values else None))
    return out


def aim(run: Run, target: float, metric: Metric) -> Run:
    """`run` stopping at the first epoch its validation figure reaches `target` (within the metric's margin)."""
    train = (replace(run.config.train, target_accuracy=target, stop_at_target=True) if metric.higher_is_better
             else replace(run.config.train, target_bpb=target, stop_at_target=True))
    return replace(run, config=replace(run.config, train=train))


def typed(raw: dict) -> C.Config:
    """A raw config (a plan's, with its tuned values set) parsed against every registered method."""
    return C.from_dict(raw, runconfig.method_configs())


def train_epochs(raw: dict) -> int:
    return raw.get("train", {}).get("epochs", C.TrainConfig().epochs)
