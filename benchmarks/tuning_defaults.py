"""Which pruned search finds the grid's best: every candidate default replayed over many sampler seeds.

A tuning trial is a deterministic run: the same config and seed give the same validation figure at
every epoch, and a pruned trial's epochs are the first epochs of the same run left to finish. So this
script runs each space's whole grid once, for real (`lowband train` per setting, through
lowband.comparison.tuning, no pruning), and records per setting its validation curve, its CPU
seconds (user + system of the trial and its workers, as tuning counts them) and its wall times
(start-up, and the trainer's elapsed seconds at each epoch). Trials start warm (lowband.training.warm):
the server's own start-up, its imports, is charged once to every search, the grid's included; it
is measured when the replay runs (the median of three), so every record is charged the same.
Then it replays a search: lowband's own `tune_label`, with its real sampler, pruner, repeat rule
and choice, where a trial reads its curve from the record instead of training. A trial stopped
after epoch k is charged its start-up and the first k epochs' share of the setting's CPU (CPU
taken proportional to wall time within a trial). `--live SEED` runs the chosen default for real on
one sampler seed, to check the replay against it.

Spaces (the two of issue 44):
- `mnist1d`: local SGD on MNIST-1D (cnn1d), 2 workers, 3,000 samples, 4 epochs a trial,
  optim.lr in {0.02, 0.05, 0.1, 0.2} x method.tau in {2, 8, 32};
- `lm`: DiLoCo on the lm suite (GPT tiny, first 1 MB of the KJV, 4 workers), 2 epochs a trial,
  optim.lr in {0.001, 0.002, 0.004} x method.outer_lr in {0.5, 0.9} x method.tau in {16, 32}.

Prints, per candidate and sampler seed, the best setting found, its gap to the grid's best, whether
that is within the metric's margin (bits per byte: 1%; accuracy: the larger of 0.5 points and one
validation sample), the distinct settings tried and pruned, and the CPU share of the grid's; then
per candidate the seeds within the margin and the mean and worst CPU share. Goal (issue 44): within
the margin on at least 4 of 5 seeds, at no more than half the grid's CPU.

A deterministic sampler (the axis search) has one outcome whatever its seed, so sampler seeds alone say
nothing of how it fares against the noise of training. `--train-seeds 0,1,2,3,4` records the grid
once per train.seed (a trial's initialisation and data order) and replays every candidate on each:
the last lines say on how many training seeds each candidate finds that seed's grid's best.

Run: python benchmarks/tuning_defaults.py --space mnist1d [--seeds 20] [--train-seeds 0,1] [--candidates A,B]
     [--out DIR] [--live SEED]
The grid's record is kept in benchmarks/results/tuning_defaults/SPACE.json (train.seed 0) and
SPACE-seedN.json (reused when present: delete one to measure afresh). The mnist1d grid takes about 3
minutes on 2 cores, the lm grid 25.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from common import commit
from lowband.catalog import load_all
from lowband.comparison import tuning as T
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.plan import typed
from lowband.comparison.request import Request, plan_for
from lowband.comparison.space import parse_tune
from lowband.data.base import load_dataset
from lowband.data.metric import ACCURACY, BITS_PER_BYTE, Metric
from lowband.run.metrics import read_metrics
from lowband.run.workers import can_fork

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tuning_defaults")


@dataclass(frozen=True)
class Space:
    suite: str
    label: str
    overrides: dict
    tune: tuple[str, ...]
    epochs: int
    metric: Metric


SPACES = {
    "mnist1d": Space("quick", "local_sgd", {"train": {"workers": 2}, "data": {"num_samples": 3000}},
                     ("optim.lr=0.02,0.05,0.1,0.2", "method.tau=2,8,32"), 4, ACCURACY),
    "mnist1d-diloco": Space("quick", "diloco", {"train": {"workers": 2}, "data": {"num_samples": 3000}},
                            ("optim.lr=0.02,0.05,0.1", "method.outer_lr=0.5,0.7,0.9", "method.tau=4,16"), 4, ACCURACY),
    "lm": Space("lm", "diloco", {}, ("optim.lr=0.001,0.002,0.004", "method.outer_lr=0.5,0.9", "method.tau=16,32"),
                2, BITS_PER_BYTE),
}


def warm_server_cpu() -> float:
    """CPU seconds of a warm-start server's start-up (lowband.training.warm: its imports), paid once per search;
    0 where trials start cold (their start-up is in each trial's CPU)."""
    if not can_fork():
        return 0.0
    before = T.children_cpu()
    subprocess.run([sys.executable, "-c", "import importlib; from lowband.training import warm; "
                    "[importlib.import_module(m) for m in warm.PRELOAD]; "
                    "from lowband.catalog import load_all; load_all()"], check=True)
    return T.children_cpu() - before


def priced(table: dict, server: float) -> dict:
    """`table` with the server's CPU as measured now (`server`) and the grid's CPU (server + every trial)."""
    trials = sum(s["cpu_s"] for s in table["settings"].values())
    return {**table, "server_cpu_s": server, "grid_cpu_s": server + trials}


def key(values: dict) -> str:
    return T.describe(dict(sorted(values.items())))


def new_plan(space: Space, out: str, sampler: str, pruner: str, seed: int, trials: int | None = None,
             train_seed: int = 0):
    """A comparison folder under `out` tuning the space's label (nothing else runs); its trials train with
    train.seed=`train_seed` (the sampler's seed is `seed`)."""
    tune = parse_tune(list(space.tune), space.epochs, trials, sampler, seed, pruner)
    plan, folder = plan_for(Request(methods=[space.label], suite=space.suite, overrides=space.overrides,
                                    seeds=[train_seed], tune=tune, out=out))
    ComparisonDir(folder).save_plan(plan)
    return plan, folder


# ---- the grid, run once for real --------------------------------------------------------------
def record_grid(space: Space, path: str, out: str, train_seed: int = 0) -> dict:
    """Run every setting (no pruning), recording each trial's curve, CPU and wall; the record is saved
    after every trial."""
    table: dict = {"settings": {}}
    real = T.run_trial

    def timed(folder, run, trial, metric):
        wall = time.perf_counter()
        outcome = real(folder, run, trial, metric)
        if outcome is not None:
            records = read_metrics(ComparisonDir(folder).file(run.dir))
            table["settings"][key(run.values)] = {
                "values": run.values, "status": outcome.status, "cpu_s": round(outcome.cpu_s or 0.0, 2),
                "wall_s": round(time.perf_counter() - wall, 2),
                "curve": [r.value(metric.val_key) for r in records],
                "elapsed_s": [r.time.get("elapsed_s") for r in records]}
            save(path, table)
        return outcome

    plan, folder = new_plan(space, out, "grid", "none", 0, train_seed=train_seed)
    T.run_trial = timed
    try:
        rows, _ = T.tune_label(folder, plan, space.label, space.metric) or ([], {})
    finally:
        T.run_trial = real
    server = warm_server_cpu()
    table.update(space=space.label, epochs=space.epochs, commit=commit(), val_samples=val_samples(plan, space),
                 train_seed=train_seed,
                 server_cpu_s=round(server, 2),
                 grid_cpu_s=round(server + sum(s["cpu_s"] for s in table["settings"].values()), 1))
    save(path, table)
    return table


def val_samples(plan, space: Space) -> int:
    """How many validation examples the space's metric is measured on (accuracy's one-sample margin)."""
    cfg = typed(plan.configs[space.label])
    data = load_dataset(cfg.data)
    return 0 if data.y_val is None else int(data.y_val.shape[0])


def save(path: str, table: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


# ---- a search, replayed -----------------------------------------------------------------------
def charge(entry: dict, epoch: int) -> float:
    """CPU seconds of a trial stopped after `epoch`: start-up plus its first epochs' share of the wall."""
    elapsed = entry["elapsed_s"]
    startup = max(0.0, entry["wall_s"] - elapsed[-1])
    return entry["cpu_s"] * min(1.0, (startup + elapsed[epoch - 1]) / entry["wall_s"])


def replay(space: Space, table: dict, candidate: str, seed: int, scratch: str) -> dict:
    """One search of `candidate` with sampler seed `seed`, every trial read from the grid's record."""
    sampler, pruner_name, trials, make_sampler = CANDIDATES[candidate]
    trials = trials_of(space, trials)
    own = pruner_name.removeprefix("lowband-") if pruner_name.startswith("lowband-") else "none"
    plan, folder = new_plan(space, scratch, sampler, own, seed, trials)
    spent: list[float] = []

    def from_record(folder, run, trial, metric):
        entry = table["settings"][key(run.values)]
        curve = entry["curve"]
        for epoch, value in enumerate(curve, start=1):
            if T.judged(trial, epoch, value, len(curve)):
                spent.append(charge(entry, epoch))
                return T.Outcome("pruned", value, epoch)
        spent.append(entry["cpu_s"])
        return T.Outcome(entry["status"], curve[-1], len(curve))

    real_run, real_pruner, real_sampler = T.run_trial, T.pruner, T.sampler
    T.run_trial = from_record
    if pruner_name in PRUNERS:
        T.pruner = lambda tune, epochs: PRUNERS[pruner_name](epochs)
    T.sampler = make_sampler or real_sampler
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rows, _ = T.tune_label(folder, plan, space.label, space.metric) or ([], {})
    finally:
        T.run_trial, T.pruner, T.sampler = real_run, real_pruner, real_sampler
    return summary(rows, table.get("server_cpu_s", 0.0) + sum(spent), table)


def summary(rows, cpu: float, table: dict) -> dict:
    """What a search found: its chosen setting and figure, distinct settings tried and pruned, CPU share."""
    best = next((r for r in rows if r.is_chosen), None)
    ran = [r for r in rows if not r.status.startswith("repeat")]
    return {"best": None if best is None else best.val, "at": "" if best is None else " ".join(best.value.split()),
            "tried": len({r.value for r in ran}), "pruned": len({r.value for r in ran if r.status == "pruned"}),
            "cpu": cpu, "share": cpu / table["grid_cpu_s"]}


def margin(space: Space, table: dict) -> float:
    """The metric's margin in its own units: relative for bits per byte; for accuracy, points."""
    if space.metric is BITS_PER_BYTE:
        return space.metric.margin
    return max(0.005, 1.0 / table["val_samples"]) if table.get("val_samples") else 0.005


def within(space: Space, table: dict, found: float | None) -> tuple[bool, float]:
    """(within the margin of the grid's best, the gap: relative for a loss, points for accuracy)."""
    grid = grid_best(space, table)[1]
    if found is None:
        return False, math.inf
    if space.metric.higher_is_better:
        gap = grid - found
        return gap <= margin(space, table) + 1e-12, gap
    gap = found / grid - 1.0
    return gap <= margin(space, table) + 1e-12, gap


def grid_best(space: Space, table: dict) -> tuple[str, float]:
    finished = {k: s["curve"][-1] for k, s in table["settings"].items() if s["status"] == "ok"}
    pick = max if space.metric.higher_is_better else min
    best = pick(finished, key=lambda k: finished[k])
    return best, finished[best]


# ---- the candidates -----------------------------------------------------------------------------
def _median(startup: int, warm_share: float):
    def make(epochs: int):
        warm = max(1, math.ceil(warm_share * epochs)) if warm_share else 0
        return T.optuna().pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=min(warm, epochs - 1))
    return make


def _percentile(p: float, startup: int, warm_share: float):
    def make(epochs: int):
        warm = max(1, math.ceil(warm_share * epochs)) if warm_share else 0
        return T.optuna().pruners.PercentilePruner(p, n_startup_trials=startup, n_warmup_steps=min(warm, epochs - 1))
    return make


def _halving(eta: int):
    return lambda epochs: T.optuna().pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=eta)


def _halving_from(share: float, eta: int):
    """Successive halving whose first rung is `share` of the trial's epochs (halving3 decides at epoch 1)."""
    return lambda epochs: T.optuna().pruners.SuccessiveHalvingPruner(
        min_resource=max(1, math.ceil(share * epochs)), reduction_factor=eta)


def _hyperband(eta: int):
    return lambda epochs: T.optuna().pruners.HyperbandPruner(min_resource=1, max_resource=epochs, reduction_factor=eta)


def _incumbent(warm_share: float):
    """Stop a trial, from `warm_share` of its epochs on, when it is behind the best completed trial at the
    same epoch (stop 50's candidate: the compass search's own yardstick, its centre, instead of the median)."""
    def make(epochs: int):
        optuna = T.optuna()
        warm = min(max(1, math.ceil(warm_share * epochs)), epochs - 1)

        class Incumbent(optuna.pruners.BasePruner):
            def prune(self, study, trial) -> bool:
                step = trial.last_step
                done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if step is None or step < warm or not done:
                    return False
                best = study.best_trial
                ahead = best.intermediate_values.get(step)
                value = trial.intermediate_values[step]
                if ahead is None:
                    return False
                return value < ahead if study.direction.name == "MAXIMIZE" else value > ahead

        return Incumbent()
    return make


PRUNERS = {
    "none": lambda epochs: T.optuna().pruners.NopPruner(),
    "median": _median(2, 0.0),  # lowband's default before issue 44: may stop a trial after its first epoch
    "median-half": _median(2, 0.5),  # no decision before half the trial's epochs
    "p25-half": _percentile(25.0, 2, 0.5),  # keep the best quarter, from half the trial on
    "incumbent-half": _incumbent(0.5),  # behind the best completed trial at the same epoch, from half the trial
    "incumbent-quarter": _incumbent(0.25),  # the same from a quarter of the trial (epoch 1 of 4)
    "median-quarter": _median(2, 0.25),
    "halving3": _halving(3),
    "halving3-half": _halving_from(0.5, 3),  # its first rung at half the trial
    "hyperband3": _hyperband(3),
}

def _tpe(multivariate: bool, startup: int):
    def make(tune, fields):
        return T.optuna().samplers.TPESampler(seed=tune.seed, n_startup_trials=startup, multivariate=multivariate)
    return make


def _gp(startup: int):
    def make(tune, fields):
        return T.optuna().samplers.GPSampler(seed=tune.seed, n_startup_trials=startup)
    return make


def _adjacent(tune, fields):
    """The axis search whose one-field changes are only the neighbouring values in each (ordered) list: a
    pattern search that walks along a long list instead of polling all of it (stop 48's candidate)."""
    from lowband.comparison.axis import AxisSampler

    class Adjacent(AxisSampler):
        def line(self, point, field):
            values = list(self.space.values())[field]
            at = values.index(point[field])
            return [point[:field] + (v,) + point[field + 1:] for v in values[max(at - 1, 0):at + 2] if v != point[field]]

    return Adjacent({f: list(tune.param(f).values) for f in fields}, seed=tune.seed)


def _pattern(adjacent: bool):
    """The axis search with Hooke and Jeeves' pattern move (stop 51's candidate): once every one-field change
    of the centre has run, it runs next the setting that takes, in every field where one improved on the
    centre, that field's best change, when that combines two fields or more; then it goes on as before."""
    def make(tune, fields):
        from optuna.trial import TrialState

        base = type(_adjacent(tune, fields)) if adjacent else __import__(
            "lowband.comparison.axis", fromlist=["AxisSampler"]).AxisSampler

        class Pattern(base):
            def after_poll(self, center, trials, maximize):
                return self.jump(center, self.values(trials), maximize)

            def values(self, trials):
                return {self.point(t.params): float(t.value) for t in trials
                        if t.state == TrialState.COMPLETE and t.value is not None and self.covers(t.params)}

            def jump(self, center, values, maximize):
                """The pattern move from `center`: each field's best improving change, combined (None: fewer
                than two fields improved, or the centre has no complete figure)."""
                if center not in values:
                    return None
                sign = 1 if maximize else -1
                moved = list(center)
                for field in range(len(self.space)):
                    done = [p for p in self.line(center, field) if p in values]
                    top = max(done, key=lambda p: sign * values[p], default=None)
                    if top is not None and sign * values[top] > sign * values[center]:
                        moved[field] = top[field]
                changed = sum(a != b for a, b in zip(moved, center, strict=True))
                return tuple(moved) if changed >= 2 else None

        return Pattern({f: list(tune.param(f).values) for f in fields}, seed=tune.seed)
    return make


# name -> (sampler, pruner, trials: None = the sampler's default, a sampler factory in lowband's place or None);
# a pruner of PRUNERS is put in lowband's place, "lowband-median" is lowband's own median pruner
CANDIDATES = {
    "default": ("auto", "lowband-median", None, None),  # lowband's defaults: the axis search, the warmed-up median
    "axis+median-half": ("axis", "median-half", None, None),  # the default until stop 52 (median from half)
    "axis": ("axis", "none", None, None),  # the axis search to its end, no pruning
    "axis-1poll+median-half": ("axis", "median-half", "poll", None),  # stopped after its first poll
    "axis-adjacent": ("axis", "none", None, _adjacent),  # stop 48: one-field changes to neighbouring values only
    "axis-adjacent+median-half": ("axis", "lowband-median", None, _adjacent),
    # stop 49: the adjacent axis search, keeping at half a trial only what is in the best quarter so far
    "axis-adjacent+p25-half": ("axis", "p25-half", None, _adjacent),
    # stop 50: the adjacent axis search, stopping a trial behind the best completed one from half a trial
    "axis-adjacent+incumbent-half": ("axis", "incumbent-half", None, _adjacent),
    "axis+incumbent-half": ("axis", "incumbent-half", None, None),
    # stop 52: the axis search, then every other setting (a whole grid, the axis search's settings first)
    "axis-then-grid+median-half": ("axis", "lowband-median", "all", None),
    "axis-then-grid+incumbent-half": ("axis", "incumbent-half", "all", None),
    # stop 52: deciding from a quarter of the trial (epoch 1 of 4; lm's 2-epoch trials: epoch 1, as above)
    "axis-adjacent+incumbent-quarter": ("axis", "incumbent-quarter", None, _adjacent),
    "axis-adjacent+median-quarter": ("axis", "median-quarter", None, _adjacent),
    # stop 51: the pattern move (Hooke and Jeeves) after each full poll
    "pattern+median-half": ("axis", "lowband-median", None, _pattern(False)),
    "pattern+incumbent-half": ("axis", "incumbent-half", None, _pattern(False)),
    "pattern-adjacent+incumbent-half": ("axis", "incumbent-half", None, _pattern(True)),
    "grid": ("grid", "none", None, None),
    "grid+median": ("grid", "median", None, None),  # lowband's default before issue 44
    "grid+median-half": ("grid", "median-half", None, None),
    "grid+p25-half": ("grid", "p25-half", None, None),
    "grid+halving3": ("grid", "halving3", None, None),
    "grid+incumbent-half": ("grid", "incumbent-half", None, None),  # stop 52
    "grid+halving3-half": ("grid", "halving3-half", None, None),  # stop 52
    "grid+hyperband3": ("grid", "hyperband3", None, None),
    "half-grid": ("grid", "none", "half", None),  # half the settings, at random
    "tpe-half+median": ("tpe", "median", "half", None),  # the search (6 TPE trials of 12)
    "tpe-half-mv": ("tpe", "none", "half", _tpe(True, 2)),  # multivariate TPE, 2 random starts
    "gp-half": ("tpe", "none", "half", _gp(2)),  # Optuna's Gaussian-process sampler
}
DETAIL = ("default", "tpe-half+median")


def trials_of(space: Space, trials) -> int | None:
    """A candidate's trial count: None (the sampler's default), 'half' the settings, one 'poll' (the axis
    search's first: the middle and every one-field change of it) or 'all' the settings."""
    sizes = [len(spec.split("=", 1)[1].split(",")) for spec in space.tune]
    if trials == "half":
        return math.ceil(math.prod(sizes) / 2)
    if trials == "poll":
        return 1 + sum(n - 1 for n in sizes)
    if trials == "all":
        return math.prod(sizes)
    return trials


# ---- main ---------------------------------------------------------------------------------------
def report(space_name: str, space: Space, table: dict, seeds: int, scratch: str, names: list[str]) -> list[dict]:
    """Every candidate over `seeds` sampler seeds on one recorded grid: a line per seed for the DETAIL ones,
    a summary for all; returns per candidate its hits (within the margin, per sampler seed) and CPU shares."""
    best_at, best = grid_best(space, table)
    unit = "pts" if space.metric.higher_is_better else "%"
    print(f"\n{space_name}, train.seed {table.get('train_seed', 0)}: {len(table['settings'])} settings x "
          f"{space.epochs} epochs, grid CPU {table['grid_cpu_s']:.1f} s (trials recorded at {table['commit']}; the "
          f"server's {table['server_cpu_s']:.2f} s measured now); grid's best "
          f"{space.metric.val_key} {best:.4f} at {best_at}; margin {margin(space, table):.4g}"
          f"{' (relative)' if unit == '%' else ' (accuracy)'}; replayed at {commit()}, sampler seeds 0-{seeds - 1}")
    out = []
    for name in names:
        results = [replay(space, table, name, s, scratch) for s in range(seeds)]
        hits = []
        for s, r in enumerate(results):
            ok, gap = within(space, table, r["best"])
            hits.append(ok)
            if name in DETAIL:
                shown = "-" if r["best"] is None else f"{r['best']:.4f}"
                print(f"  {name:<24} seed {s:>2}: best {shown} at {r['at'] or '-':<16} gap {100 * gap:+6.2f} {unit} "
                      f"{'within ' if ok else 'OUTSIDE'}; tried {r['tried']:>2}, pruned {r['pruned']:>2}; "
                      f"CPU {r['share']:.2f}x")
        shares = [r["share"] for r in results]
        print(f"  {name:<24} => within the margin on {sum(hits):>2}/{seeds} seeds ({sum(hits[:5])}/5 on seeds 0-4); "
              f"CPU mean {statistics.mean(shares):.2f}x, worst {max(shares):.2f}x; settings tried "
              f"{statistics.mean(r['tried'] for r in results):.1f}")
        out.append({"name": name, "hits": hits, "shares": shares})
    return out


def across(space_name: str, by_seed: dict[int, list[dict]]) -> None:
    """Per candidate, over every recorded training seed: on how many the search finds that grid's best on
    most sampler seeds, and the CPU share's mean and worst (the training seed is the noise a real search
    meets; a deterministic sampler has the same outcome on every sampler seed)."""
    if len(by_seed) < 2:
        return
    print(f"\n{space_name}: over train.seed {', '.join(map(str, by_seed))} (a seed counts when the search is "
          "within the margin on at least half its sampler seeds)")
    names = [row["name"] for row in next(iter(by_seed.values()))]
    for i, name in enumerate(names):
        rows = [rows[i] for rows in by_seed.values()]
        found = [sum(r["hits"]) * 2 >= len(r["hits"]) for r in rows]
        shares = [x for r in rows for x in r["shares"]]
        per = " ".join(f"{sum(r['hits'])}/{len(r['hits'])}" for r in rows)
        pairs = sum(sum(r["hits"]) for r in rows)
        print(f"  {name:<28} => found on {sum(found)}/{len(rows)} training seeds, {pairs}/{len(shares)} searches "
              f"(sampler seeds within: {per}); CPU mean {statistics.mean(shares):.2f}x, worst {max(shares):.2f}x")


def live(space: Space, table: dict, seed: int, out: str) -> None:
    """lowband's default search run for real on sampler seed `seed` at the record's train.seed, beside its replay."""
    plan, folder = new_plan(space, out, "auto", "median", seed, train_seed=table.get("train_seed", 0))
    wall = time.perf_counter()
    rows, _ = T.tune_label(folder, plan, space.label, space.metric) or ([], {})
    spent = sum(r.cpu_s or 0.0 for r in rows if not r.status.startswith("repeat"))
    real = summary(rows, table.get("server_cpu_s", 0.0) + spent, table)
    with tempfile.TemporaryDirectory(prefix="tuning_replay-") as scratch:
        replayed = replay(space, table, "default", seed, scratch)
    print(f"\nlive default search, seed {seed}: best {real['best']} at {real['at']}, tried {real['tried']}, pruned "
          f"{real['pruned']}, CPU {real['cpu']:.0f} s = {real['share']:.2f}x the recorded grid's, wall "
          f"{time.perf_counter() - wall:.0f} s; replayed: best {replayed['best']} at {replayed['at']}, tried "
          f"{replayed['tried']}, pruned {replayed['pruned']}, CPU {replayed['share']:.2f}x ({folder})")


def grid_path(space_name: str, train_seed: int) -> str:
    """Where a space's grid at `train_seed` is recorded (seed 0 keeps the first records' name)."""
    return os.path.join(RESULTS, f"{space_name}.json" if train_seed == 0 else f"{space_name}-seed{train_seed}.json")


def grid(space_name: str, train_seed: int, out: str) -> dict:
    """The recorded grid of `space_name` at `train_seed`, run and recorded first when there is none."""
    path = grid_path(space_name, train_seed)
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    print(f"running the {space_name} grid at train.seed {train_seed} in {out} (recorded in {path})", file=sys.stderr)
    return record_grid(SPACES[space_name], path, os.path.join(out, f"seed{train_seed}"), train_seed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--space", choices=sorted(SPACES), required=True)
    p.add_argument("--seeds", type=int, default=20, help="sampler seeds replayed per candidate (0..N-1)")
    p.add_argument("--train-seeds", default="0", help="comma-separated train.seed values: one recorded grid each "
                   "(recorded first when missing), every candidate replayed on each (default: 0)")
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated, of: " + ", ".join(CANDIDATES))
    p.add_argument("--out", default=None, help="where the grid's comparison folder goes (default: temporary)")
    p.add_argument("--record-only", action="store_true", help="run and record the grid, replay nothing")
    p.add_argument("--live", type=int, default=None, metavar="SEED",
                   help="also run lowband's default search for real on this sampler seed, beside its replay "
                        "(on the first of --train-seeds)")
    args = p.parse_args()
    names = [n for n in args.candidates.split(",") if n]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        p.error(f"--candidates: unknown {', '.join(unknown)}; one of {', '.join(CANDIDATES)}")
    try:
        train_seeds = [int(x) for x in args.train_seeds.split(",")]
    except ValueError:
        p.error(f"--train-seeds: {args.train_seeds!r} is not a comma-separated list of integers")
    if not 1 <= len(set(train_seeds)) == len(train_seeds) <= 20 or min(train_seeds) < 0:
        p.error(f"--train-seeds: {args.train_seeds!r}; allowed: 1 to 20 distinct integers >= 0 (each records a grid)")
    load_all()
    space = SPACES[args.space]
    out = args.out or tempfile.mkdtemp(prefix="tuning_defaults-")
    tables = {seed: grid(args.space, seed, out) for seed in train_seeds}
    if args.record_only:
        return
    server = statistics.median(warm_server_cpu() for _ in range(3))  # measured now, the same for every record
    tables = {seed: priced(table, server) for seed, table in tables.items()}
    with tempfile.TemporaryDirectory(prefix="tuning_replay-") as scratch:
        by_seed = {seed: report(args.space, space, table, args.seeds, scratch, names) for seed, table in tables.items()}
    across(args.space, by_seed)
    if args.live is not None:
        live(space, tables[train_seeds[0]], args.live, out)


if __name__ == "__main__":
    main()
