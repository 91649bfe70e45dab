"""The Python API: train, compare and load models from a script or a notebook.

    >>> import lowband
    >>> run = lowband.train(method="local_sgd", workers=2, epochs=1, **{"method.tau": 4})
    >>> run.test_acc, run.bytes_sent_per_worker, run.run_dir
    >>> model = lowband.load_model(run.run_dir)          # a torch.nn.Module, in eval mode
    >>> result = lowband.compare(["allreduce", "local_sgd:tau=16"], workers=2, epochs=2)
    >>> print(result.table)

Settings come as in the command line: a config (a TOML path, a dict of tables or a Config),
then shortcut keywords (`workers`, `epochs`, `dataset`, `model`, `lr`, `batch_size`, `seed`,
`partition`, `samples`, `link`, `link_mode`, `sites`, `max_restarts`, `loggers`: config.SHORTCUTS,
the CLI's flags too), then dotted keys (`**{"optim.lr": 0.1}`). A bad
value raises `lowband.ConfigError` (a `lowband.LowbandError`) before any worker starts; a run
whose workers fail raises `lowband.RunFailed`. The workers are real processes, as with the CLI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from lowband import config as C
from lowband.errors import ConfigError, RunFailed
from lowband.records import EpochRecord

# Each call imports the layers it runs inside its own function: `import lowband` (which imports this
# module on first use) stays free of torch, matplotlib and redis until a call needs them.

SHORTCUTS = C.SHORTCUTS

__all__ = ["Comparison", "Run", "compare", "load_model", "train"]


@dataclass
class Run:
    """A finished run: where it is and its final figures (from metrics.jsonl)."""

    run_dir: str
    method: str
    val_acc: float | None  # the global model's final validation accuracy (rank 0's model without one)
    test_acc: float | None
    bytes_sent_per_worker: float  # training traffic, mean over workers, whole run
    epochs: int
    records: list[EpochRecord] = field(repr=False, default_factory=list)  # metrics.jsonl, one per epoch
    val_bpb: float | None = None  # a language model's final validation bits per byte (None: a classifier)
    test_bpb: float | None = None

    @classmethod
    def from_dir(cls, run_dir: str) -> Run:
        """The run in `run_dir` (finished, or stopped: its last records)."""
        from lowband.run.metrics import read_metrics
        from lowband.training.runconfig import read_run_config

        cfg = read_run_config(run_dir, "Run.from_dir(run_dir)")
        records = read_metrics(run_dir)
        done = [r for r in records if r.test_acc is not None]
        end, last = (done[-1] if done else EpochRecord(epoch=0)), (records[-1] if records else EpochRecord(epoch=0))
        return cls(run_dir, cfg.method.name, end.val_acc, end.test_acc, last.bytes_sent_per_worker, last.epoch,
                   records, end.val_bpb, end.test_bpb)

    @property
    def config(self) -> C.Config:
        from lowband.training.runconfig import read_run_config

        return read_run_config(self.run_dir, "Run.config")

    def model(self, local: bool = False):
        """The run's final model (see `load_model`)."""
        return load_model(self.run_dir, local=local)


@dataclass
class Comparison:
    """A finished comparison: its directory, one Run per method, and the comparison table as text."""

    folder: str
    runs: list[Run]
    table: str = field(repr=False, default="")


def build_config(config=None, method: str | None = None, overrides: dict | None = None) -> C.Config:
    """A validated Config from a config (TOML path, dict or Config), a method and keyword overrides.

    >>> build_config(method="allreduce", overrides={"epochs": 3, "optim.lr": 0.1}).optim.lr
    0.1
    """
    from lowband.training.runconfig import method_configs

    if isinstance(config, C.Config):
        raw = C.to_dict(config)
    elif isinstance(config, (str, os.PathLike)):
        raw = C.read_toml(os.fspath(config))
    elif config is None or isinstance(config, dict):
        raw = dict(config or {})
    else:
        raise ConfigError("config", config, "must be a TOML path, a dict of tables or a lowband Config")
    if method:
        raw = C.merge(raw, {"method": {"name": method}})
    for key, value in (overrides or {}).items():
        path = SHORTCUTS.get(key, key).split(".")
        if len(path) < 2:
            raise ConfigError(key, value, "unknown keyword; use SECTION.KEY (e.g. **{'optim.lr': 0.1}) or one of "
                                          + ", ".join(SHORTCUTS))
        raw = C.merge(raw, C.nest(path, value))
    return C.from_dict(raw, method_configs())


def train(method: str | None = None, config=None, *, run_dir: str | None = None, out: str = "runs",
          quiet: bool = False, **overrides) -> Run:
    """Train one method with real worker processes and return the finished `Run`.

    >>> run = lowband.train(method="allreduce", workers=2, epochs=3, dataset="mnist1d")
    >>> run = lowband.train(method="local_sgd", workers=2, epochs=1, **{"method.tau": 4})
    >>> run = lowband.train(config="my.toml", run_dir="runs/mine", quiet=True)

    `quiet`: no per-epoch lines on the console (train.log still gets them).
    Raises ConfigError (bad settings; nothing is started) or RunFailed (a worker failed).
    """
    from lowband.catalog import load_all
    from lowband.training import session

    load_all()
    cfg = build_config(config, method, overrides)
    with _quiet(quiet):
        code, where = session.start(cfg, run_dir, out=out)
    if code != 0:
        raise RunFailed(code, where)
    return Run.from_dir(where)


def compare(methods: list[str], config=None, *, out: str = "runs", quiet: bool = False, seeds: list[int] | None = None,
            tune: list[str] | None = None, tune_epochs: int | None = None, tune_trials: int | None = None,
            tune_sampler: str = "auto", tune_seed: int = 0, tune_pruner: str = "median", tune_on: int | None = None,
            budget: str | None = None, **overrides) -> Comparison:
    """Train several methods on the same data, model and seed, one after another; the comparison table.

    >>> result = lowband.compare(["allreduce", "local_sgd:tau=16", "ec_dnn:ensemble=margin"], workers=4, epochs=10)
    >>> print(result.table)
    >>> best = max(result.runs, key=lambda r: r.val_acc)
    >>> lowband.compare(["allreduce", "diloco:tau=16"], seeds=[0, 1], tune=["optim.lr=0.002,0.004,0.008"],
    ...                 tune_epochs=2, budget="target:4", dataset="text", model="gpt")

    Methods are named as in `lowband compare --methods` (NAME or NAME:KEY=VALUE[:...]). `seeds`, `tune`
    (each a FIELD=SPEC of `--tune`), `tune_epochs`, `tune_trials`, `tune_sampler`, `tune_seed`,
    `tune_pruner`, `tune_on` and `budget` are the command's options of the same names, with its defaults
    (`tune_on=0, seeds=[10, 11, 12]`: choose on seed 0, publish on seeds that chose nothing).
    Raises ConfigError before anything runs, or RunFailed when any run failed (its `run_dir`
    is then the comparison directory).
    """
    from lowband.catalog import load_all
    from lowband.comparison import runner as cmp
    from lowband.comparison.plan import parse_seeds, parse_spec
    from lowband.comparison.request import Request, plan_for
    from lowband.comparison.space import parse_tune

    load_all()
    if isinstance(methods, str) or not methods:
        raise ConfigError("methods", methods, "must be a non-empty list of method specs, e.g. ['allreduce']")
    if isinstance(tune, str):
        raise ConfigError("tune", tune, "must be a list of FIELD=SPEC strings, e.g. ['optim.lr=0.05,0.1']")
    base = C.to_dict(build_config(config, parse_spec(methods[0])[0], overrides))
    if tune_on is not None and not tune:
        raise ConfigError("tune_on", tune_on, "is the training seed of tuning trials; give tune too")
    search = (parse_tune(list(tune), tune_epochs, tune_trials, tune_sampler, tune_seed, tune_pruner, tune_on)
              if tune else None)
    chosen = parse_seeds(",".join(str(s) for s in seeds)) if seeds is not None else None  # the CLI's checks
    plan, folder = plan_for(Request(methods=list(methods), base=base, out=out, seeds=chosen, tune=search,
                                    budget=budget))
    with _quiet(quiet):
        code, folder, rows = cmp.compare(plan, folder)
    if code != 0:
        raise RunFailed(code, folder)
    return Comparison(folder, [Run.from_dir(r.run_dir) for r in rows], cmp.format_table(rows, reference=plan.reference))


def load_model(run_dir: str, local: bool = False):
    """A finished run's final model as a torch.nn.Module in eval mode, rebuilt from the run's config.

    >>> model = lowband.load_model("runs/allreduce-20261121-101500")
    >>> logits = model(x)            # x shaped like the run's data: (batch, *in_shape)

    The global model where the method has one (an ensemble run's as its members and weights),
    else rank 0's; `local=True`: the best local model (model_L.safetensors) instead. The input shape
    and classes come from the file's metadata (lowband version, method, model options, in_shape,
    num_classes), so the data set is not read.
    """
    import json

    from lowband.comparison.churn import load_final_model
    from lowband.run.checkpoint import model_metadata
    from lowband.run.rundir import RunDir
    from lowband.training.runconfig import read_run_config

    read_run_config(run_dir, "load_model(run_dir)")  # a path that is no run says so in the API's own words
    run = RunDir(run_dir)
    meta = model_metadata(run.local_model_path() if local else run.model_path(0))
    if "in_shape" in meta and "num_classes" in meta:  # written by lowband since 0.1.0
        in_shape, classes = tuple(json.loads(meta["in_shape"])), int(meta["num_classes"])
    else:  # an older run: the shapes from its data set
        from lowband.data.base import read_dataset

        data = read_dataset(read_run_config(run_dir, "load_model(run_dir)").data)
        in_shape, classes = data.in_shape, data.num_classes
    return load_final_model(run_dir, in_shape, classes, local)


class _quiet:
    """Sets LOWBAND_QUIET for the workers started inside (restores it after)."""

    def __init__(self, on: bool):
        self.on = on
        self.before: str | None = None

    def __enter__(self):
        self.before = os.environ.get("LOWBAND_QUIET")
        if self.on:
            os.environ["LOWBAND_QUIET"] = "1"

    def __exit__(self, *exc):
        if self.before is None:
            os.environ.pop("LOWBAND_QUIET", None)
        else:
            os.environ["LOWBAND_QUIET"] = self.before
