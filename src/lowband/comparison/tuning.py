"""Tuning on Optuna: per label one study in the comparison's tuning.db (SQLite), every trial a real run.

Each label searches the `--tune` fields it has (lowband.comparison.space) in `--tune-trials` trials.
The sampler (`--tune-sampler`, lowband.comparison.space's `sampler_name`) is by default the axis search
when every field is a list (lowband.comparison.axis: one field at a time from the middle, ending by
itself at a local optimum), else TPE; `grid` and `random` are there to ask for; all seeded with
`--tune-seed`. A trial is a `lowband train` process in tune/LABEL/trial-NNN (started warm, from a
server that has imported torch: lowband.training.warm); while it trains, this
process reads the validation figure of every epoch from its metrics.jsonl, reports it to the trial,
and when the pruner says the trial is losing, stops it (SIGTERM: the launcher stops its workers
as on Ctrl-C) and writes pruned.txt in its directory. The trial processes are watched from outside,
so the trainer knows nothing of tuning, and a stopped trial keeps its checkpoint and records; the
files are read five times a second, so a trial may run on into the next epoch while it is being stopped.

Pruners: `median` (the default) stops a trial whose validation figure at an epoch is worse than the
median of the finished trials' at the same epoch, once 2 trials have finished, from three quarters of
its epochs on (`warm_up`). It works at the few epochs a CPU can afford and with any number of
trials. `halving` (successive halving, reduction 3) keeps only the best third at epochs 1, 3, 9, ...:
harder pruning, but its rungs only start to matter once trials run 3 epochs or more. `none` runs
every trial to the end.

A trial's outcome is its state in the study: complete (its final validation figure), pruned (the
last one before it was stopped), failed (diverged, or exited with an error: never chosen). A trial
that was running when the comparison was interrupted stays `running` in the study; `compare
--resume` marks it failed ("interrupted"), never dropped, and retries it as a new trial with the same
values that continues its directory from its last checkpoint. Finished trials are never run again,
and values a sampler proposes a second time are not either: that trial is told the earlier result and
marked `repeat of trial N` (not counted, never chosen).
The study remembers which comparison it belongs to (a fingerprint of the plan): a tuning.db from
another comparison is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import sys
from dataclasses import dataclass

from lowband.comparison import coverage
from lowband.comparison import plan as P
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.space import Tune, show
from lowband.comparison.summary import TuningRow, status_of
from lowband.data.metric import Metric
from lowband.errors import INTERRUPTED, ConfigError
from lowband.run import launch
from lowband.run.launch import STOPPED_QUIETLY
from lowband.run.metrics import read_metrics
from lowband.run.rundir import RunDir
from lowband.training import runconfig, warm

TRIAL = "lowband.training.session:run_prepared"  # what a trial process runs: `lowband train` of a prepared folder
POLL_S = 0.2
REPEATS = 5  # a search stops after asking this many times its trials (TPE may keep proposing what it ran)
STOP_GRACE_S = 60.0


def optuna():
    """Optuna, imported when a comparison tunes (it takes a second to import), with its log kept quiet."""
    import optuna as o

    o.logging.set_verbosity(o.logging.WARNING)
    return o


def fingerprint(plan: P.Plan) -> str:
    """What makes a study this comparison's: its labels, configs and search."""
    text = json.dumps({"labels": plan.labels, "configs": plan.configs,
                       "tune": plan.tune.to_json() if plan.tune else None}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def storage_url(folder: str) -> str:
    return "sqlite:///" + os.path.abspath(ComparisonDir.of(folder).study_path)


def check_studies(folder: str, plan: P.Plan) -> None:
    """Refuse (one line, nothing written) a tuning.db that is not a study file (a directory, a link to a device,
    another kind of file), that another process holds locked, or whose studies belong to another comparison."""
    path = ComparisonDir.of(folder).study_path
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise ConfigError("tuning.db", path, "is not a regular file (a directory, or a link); move it away to tune "
                                             "afresh, or resume with the folder that holds the study")
    if not os.path.isfile(path):
        return
    o, mine = optuna(), fingerprint(plan)
    try:
        summaries = o.get_all_study_summaries(storage_url(folder))
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused alike
        if "locked" in str(e).lower():
            raise ConfigError("tuning.db", path, "is locked by another process (another `lowband compare` on this "
                                                 "folder?); wait for it to end, then resume") from None
        raise ConfigError("tuning.db", path, f"is not an Optuna study file lowband can read ({type(e).__name__}); "
                                             "move it away to tune afresh") from None
    for summary in summaries:
        theirs = summary.user_attrs.get("comparison")
        if theirs != mine:
            raise ConfigError("tuning.db", path, f"holds study {summary.study_name!r} of another comparison "
                                                 f"(fingerprint {theirs}, this one's {mine}); move it away to tune "
                                                 "afresh")


def open_study(folder: str, plan: P.Plan, label: str, metric: Metric):
    """The label's study in tuning.db, created on first use, with the plan's sampler and pruner."""
    o = optuna()
    assert plan.tune is not None
    study = o.create_study(storage=storage_url(folder), study_name=label, load_if_exists=True,
                           direction="maximize" if metric.higher_is_better else "minimize",
                           sampler=sampler(plan.tune, (plan.tuned or {}).get(label, [])),
                           pruner=pruner(plan.tune, P.trial_run(plan, label, 0, {}).config.train.epochs))
    study.set_user_attr("comparison", fingerprint(plan))
    return study


def sampler(tune: Tune, fields: list[str]):
    """The axis search (the default when every field is a list), the grid, TPE or random, seeded; TPE starts
    with a third of its trials at random."""
    o = optuna()
    if tune.sampler_name(fields) == "axis":
        from lowband.comparison.axis import AxisSampler

        return AxisSampler({f: list(tune.param(f).values) for f in fields}, seed=tune.seed)
    if tune.is_grid(fields):
        from optuna.samplers import GridSampler

        class Grid(GridSampler):
            def after_trial(self, *args, **kwargs) -> None:
                """Nothing: Optuna's stops study.optimize when the grid is spent (it raises under ask/tell, and
                on a retried trial without a grid cell); lowband counts the trials itself."""

        return Grid({f: list(tune.param(f).values) for f in fields}, seed=tune.seed)
    if tune.sampler == "random":
        return o.samplers.RandomSampler(seed=tune.seed)
    return o.samplers.TPESampler(seed=tune.seed, n_startup_trials=max(2, tune.trial_count(fields) // 3))


def pruner(tune: Tune, epochs: int):
    """The pruner of trials of `epochs` epochs: the median's first decision comes after three quarters of them."""
    o = optuna()
    if tune.pruner == "median":
        return o.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warm_up(epochs))
    if tune.pruner == "halving":
        return o.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    return o.pruners.NopPruner()


def warm_up(epochs: int) -> int:
    """The first epoch at which the median pruner may stop a trial: three quarters of its epochs, rounded up,
    and before the last (epoch 1 of 2, 3 of 4, 8 of 10). The first epochs' figures are the noisiest, and
    settings cross late: benchmarks/history/JOURNAL.md "Tuning defaults" shows the median pruner without a warm-up stopping
    the best setting at epoch 1 on 9 of 20 seeds, and from half the trial stopping it on 3 of 10 training
    seeds of MNIST-1D (from three quarters: 1 of 10, at 0.07x more of the grid's CPU)."""
    return max(1, min(math.ceil(epochs * 3 / 4), epochs - 1))


def suggest(trial, tune: Tune, fields: list[str]) -> dict:
    """The trial's value of each field: from a list, or sampled in a range (integers for an integer field)."""
    out = {}
    for field in fields:
        p = tune.param(field)
        if p.is_list:
            out[field] = trial.suggest_categorical(field, list(p.values))
        elif p.integer:
            out[field] = trial.suggest_int(field, int(p.low or 0), int(p.high or 0), log=p.log)
        else:
            out[field] = trial.suggest_float(field, float(p.low or 0), float(p.high or 0), log=p.log)
    return out


# ---- one label's search ------------------------------------------------------------------------
def tune_label(folder: str, plan: P.Plan, label: str, metric: Metric) -> tuple[list[TuningRow], dict] | None:
    """Run `label`'s trials until it has --tune-trials finished ones; (its rows, its chosen values: {} when no
    trial finished), or None when interrupted (the study keeps what finished)."""
    assert plan.tune is not None
    fields = (plan.tuned or {}).get(label, [])
    study, wanted = open_study(folder, plan, label, metric), plan.tune.trial_count(fields)
    if plan.tune.pruner != "none" and P.trial_run(plan, label, 0, {}).config.train.epochs < 2:
        print(f"{label}: trials of one epoch are never pruned (a pruner decides at the end of an epoch before the "
              "last); --tune-epochs 2 or more lets it stop losing trials", flush=True)
    retry_interrupted(study)
    asked = 0
    while counted(study) < wanted and asked < REPEATS * wanted and not converged(study, plan.tune):
        trial, asked = study.ask(), asked + 1
        values = suggest(trial, plan.tune, fields)
        if repeat(study, trial, values):
            continue
        run = P.trial_run(plan, label, trial.number, values, trial.user_attrs.get("dir"))
        trial.set_user_attr("dir", run.dir)
        of = f"{wanted}" if plan.tune.trials is not None or not open_ended(study) else f"{wanted} at most"
        print(f"\ntrial {counted(study) + 1}/{of} of {label}: {describe(run.values or {})}", flush=True)
        outcome = run_trial(folder, run, trial, metric)
        if outcome is None:
            return None
        finish(study, trial, outcome)
    if counted(study) < wanted and converged(study, plan.tune):
        print(f"{label}: the axis search reached its end after {counted(study)} trials (every one-field change of "
              "its best setting has run)", flush=True)
    elif counted(study) < wanted:
        print(f"lowband: {label}'s sampler kept proposing values it had run; {counted(study)} of {wanted} trials",
              file=sys.stderr)
    rows = tuning_rows(study, label, plan, metric)
    for line in coverage.sentences(rows, [plan.tune.param(f) for f in fields], plan.tune.sampler_name(fields)):
        print(f"{label}: {line}", flush=True)
    best = choose(rows, metric)
    return rows, ({} if best is None else dict(study.trials[best.trial].params))


def open_ended(study) -> bool:
    """Whether the study's sampler is the axis search, which may end before its trial count."""
    from lowband.comparison.axis import AxisSampler

    return isinstance(study.sampler, AxisSampler)


def converged(study, tune: Tune) -> bool:
    """Whether the axis search, left to its own end (no --tune-trials), has reached it: every one-field
    change of its best setting has run."""
    if tune.trials is not None or not open_ended(study):
        return False
    return study.sampler.converged(study.trials, study.direction.name == "MAXIMIZE")


def repeat(study, trial, values: dict) -> bool:
    """A sampler may propose values a finished trial already ran (TPE over lists does): then the trial is
    not run again but told the earlier one's result and marked `repeat of trial N`; it is not counted."""
    retried = retried_trials(study)
    earlier = next((t for t in study.trials if t.state.is_finished() and t.params == values
                    and t.number not in retried and "repeat_of" not in t.user_attrs), None)
    if earlier is None or trial.user_attrs.get("dir"):  # a retried trial continues in its own directory
        return False
    for key in ("val", "epochs", "dir"):
        trial.set_user_attr(key, earlier.user_attrs.get(key))
    trial.set_user_attr("repeat_of", earlier.number)
    trial.set_user_attr("status", f"repeat of trial {earlier.number}")
    print(f"trial {trial.number}: {describe(values)} ran as trial {earlier.number} already; not run again", flush=True)
    if earlier.value is not None:
        study.tell(trial, earlier.value)
    else:
        study.tell(trial, state=earlier.state)
    return True


def describe(values: dict) -> str:
    return " ".join(f"{field}={value:.4g}" if isinstance(value, float) else f"{field}={value}"
                    for field, value in values.items())


def counted(study) -> int:
    """Trials that finished (complete, pruned or failed), less the interrupted ones that were retried and
    the repeats of earlier ones."""
    retried = retried_trials(study)
    return sum(t.state.is_finished() and t.number not in retried and "repeat_of" not in t.user_attrs
               for t in study.trials)


def retried_trials(study) -> set[int]:
    """The numbers of the trials that were interrupted and run again (their retry names them: `retry_of`)."""
    return {int(t.user_attrs["retry_of"]) for t in study.trials if "retry_of" in t.user_attrs}


def retry_interrupted(study) -> None:
    """A trial still `running` was interrupted with the comparison: mark it failed and queue its values
    again as a new trial that names it (`retry_of`) and continues in its directory."""
    o = optuna()
    for t in study.get_trials(states=(o.trial.TrialState.RUNNING,)):
        study.enqueue_trial(t.params, user_attrs={"dir": t.user_attrs.get("dir"), "retry_of": t.number})
        study.tell(t.number, state=o.trial.TrialState.FAIL, skip_if_finished=True)


@dataclass
class Outcome:
    """How a trial ended: `status` ok, pruned, diverged or failed (N); its last validation figure and epoch;
    its CPU seconds."""

    status: str
    val: float | None
    epoch: int
    cpu_s: float | None = None  # what the trial's processes took (user + system), when known


def finish(study, trial, outcome: Outcome) -> None:
    """Tell the study how the trial ended (only an `ok` trial with a figure completes)."""
    state = optuna().trial.TrialState
    for key, value in (("status", outcome.status), ("val", outcome.val), ("epochs", outcome.epoch),
                       ("cpu_s", outcome.cpu_s)):
        trial.set_user_attr(key, value)
    if outcome.status == "ok" and outcome.val is not None:
        study.tell(trial, outcome.val)
    else:
        study.tell(trial, state=state.PRUNED if outcome.status == "pruned" else state.FAIL)


# ---- one trial ---------------------------------------------------------------------------------
def run_trial(folder: str, run: P.Run, trial, metric: Metric) -> Outcome | None:
    """Run one trial as a process of its own (`lowband train` of its prepared folder), reporting each
    epoch's validation figure and stopping it when the pruner says so; None when the trial alone was
    interrupted. Ctrl-C or SIGTERM here stops the trial and goes on up (it stays `running` in the study)."""
    run_dir = ComparisonDir.of(folder).file(run.dir)
    if RunDir(run_dir).has_records():  # a retried trial: continue from its checkpoint
        argv = [run_dir, "resume"]
    else:
        runconfig.prepare_run_dir(run.config, run_dir)
        argv = [run_dir]
    before = children_cpu()
    env = {**os.environ, STOPPED_QUIETLY: "1"}  # a pruned trial is normal: one line, ours
    proc = warm.start(TRIAL, argv, env)
    outcome = _watched(proc, trial, metric, run, run_dir)
    if outcome is not None:
        cpu = proc.cpu_s if isinstance(proc, warm.Command) else children_cpu() - before
        outcome.cpu_s = None if cpu is None else round(cpu, 3)
    return outcome


def children_cpu() -> float:
    """CPU seconds of this process's ended children (a cold trial's, its workers' included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _watched(proc, trial, metric: Metric, run: P.Run, run_dir: str) -> Outcome | None:
    """Follow the started trial to its end (launch.supervise, with the pruner's policy), stopping it when
    the pruner says so."""
    watch = Pruning(trial, metric, run.config.train.epochs, run_dir)
    try:
        code = launch.supervise([proc], watch=watch)
    except KeyboardInterrupt:
        launch.stop([proc], STOP_GRACE_S)
        raise  # the trial stays `running` in the study; `lowband` says "interrupted" (or "stopped by SIGTERM")
    if watch.pruned:
        print(f"trial {trial.number} pruned after epoch {watch.epoch} (validation {metric.name} {watch.val:.4f})",
              flush=True)
        judge = type(trial.study.pruner).__name__
        RunDir(run_dir).record_pruned(f"pruned after epoch {watch.epoch}: validation {metric.name} "
                                      f"{watch.val:.4f} was behind the other trials' ({judge})")
        return Outcome("pruned", watch.val, watch.epoch)
    watch.read(judge=False)  # the epochs written since the last look; the trial has ended
    return outcome_of(code, watch)


def outcome_of(code: int, watch: Pruning) -> Outcome | None:
    if code == INTERRUPTED:
        return None
    status = status_of(code)
    if status == "ok" and watch.val is None:
        status = "failed (no validation figure)"
    return Outcome(status, watch.val, watch.epoch)


class Pruning(launch.Watch):
    """The supervisor's policy for one tuning trial: it reads the trial's metrics.jsonl as it grows, reports
    each new epoch's validation figure to the trial and asks the pruner (never at the last epoch: there is
    nothing left to save), stopping the trial when it condemns it. A trial's failure is its outcome, said in
    the tuning table: no line here."""

    goes_on = ""
    poll_s = POLL_S

    def __init__(self, trial, metric: Metric, epochs: int, run_dir: str):
        super().__init__(keep_going=True)
        self.trial, self.metric, self.epochs, self.run_dir = trial, metric, epochs, run_dir
        self.epoch, self.val, self.pruned = 0, None, False

    def churn(self, code: int, codes: list[int | None]) -> bool:
        return True  # the trial's exit code is its outcome

    def done(self, procs, codes: list[int | None]) -> int | None:
        if codes[0] is not None:
            return codes[0]
        self.read()
        if not self.pruned:
            return None
        launch.stop(procs, STOP_GRACE_S)  # SIGTERM: the launcher stops its workers as on Ctrl-C
        return procs[0].poll()

    def read(self, judge: bool = True) -> None:
        """Report the epochs not yet seen; with `judge`, stop at the first one the pruner condemns."""
        for record in read_metrics(self.run_dir):
            value = record.value(self.metric.val_key)
            if record.epoch <= self.epoch or value is None:
                continue
            self.epoch, self.val = record.epoch, value
            if judged(self.trial, record.epoch, value, self.epochs, judge):
                self.pruned = True
                return


def judged(trial, epoch: int, value: float, epochs: int, judge: bool = True) -> bool:
    """Report `value` at `epoch` to the trial; with `judge`, whether its pruner stops it there (never at the
    last of `epochs`: nothing is left to save)."""
    trial.report(value, epoch)
    return judge and epoch < epochs and trial.should_prune()


# ---- results -----------------------------------------------------------------------------------
def tuning_rows(study, label: str, plan: P.Plan, metric: Metric) -> list[TuningRow]:
    """One TuningRow per trial of the study, in trial order; the chosen one marked."""
    fields, retried = (plan.tuned or {}).get(label, []), retried_trials(study)
    rows = [TuningRow(label=label, method=plan.configs[label]["method"]["name"], trial=t.number,
                      field=" ".join(fields), value=" ".join(show(t.params[f]) for f in fields if f in t.params),
                      metric=metric.val_key, val=t.user_attrs.get("val"), epochs=t.user_attrs.get("epochs") or 0,
                      status="interrupted" if t.number in retried else t.user_attrs.get("status") or t.state.name.lower(),
                      run_dir=t.user_attrs.get("dir") or "", cpu_s=t.user_attrs.get("cpu_s"))
            for t in study.trials if t.state.is_finished()]
    best = choose(rows, metric)
    for r in rows:
        r.chosen = "yes" if r is best else "no"
    return rows


def choose(rows: list[TuningRow], metric: Metric) -> TuningRow | None:
    """The trial with the best final validation figure among those that finished `ok` (ties: the first);
    a pruned, diverged, failed or interrupted trial is never chosen. None: no trial finished."""
    finished = [r for r in rows if r.status == "ok" and r.val is not None]
    return min(finished, key=lambda r: (-(r.val or 0.0) if metric.higher_is_better else r.val or 0.0), default=None)
