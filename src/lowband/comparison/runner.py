"""Run several methods on the same data, model and seeds, one after another, and tabulate them.

A method is named alone (`allreduce`) or with options (`ec_dnn:ensemble=margin:tau=128`).
summary.csv has one row per run; the console table is lowband.comparison.table's, the same as the report's
(seeds pooled, one reference: the target accuracy, and speed-up against Allreduce).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from lowband import config as C
from lowband import procs
from lowband.comparison import plan as P
from lowband.comparison import table
from lowband.comparison.calibrate import step_seconds
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.plan import fill, parse_spec, spec_config  # noqa: F401 (fill, parse_spec: re-exported)
from lowband.comparison.projection import run_link
from lowband.comparison.report import build, verdict
from lowband.comparison.summary import SummaryRow, TuningRow, status_of
from lowband.comparison.tuning import check_studies, tune_label
from lowband.data.metric import ACCURACY, Metric, metric_for
from lowband.errors import INTERRUPTED
from lowband.records import EpochRecord
from lowband.run import loggers
from lowband.run.metrics import median, read_metrics
from lowband.run.rundir import RunDir
from lowband.training import session
from lowband.training.spec import resolve


def with_method(base: C.Config, spec: str, defaults: dict | None = None) -> C.Config:
    """`base` running `spec`; `defaults` holds a suite's options per method name (the spec's win)."""
    name = parse_spec(spec)[0]
    raw = spec_config(spec, C.to_dict(base), {}, None, defaults, inherit=base.method.name == name)
    return P.typed(raw)


def compare(plan: P.Plan, folder: str) -> tuple[int, str, list[SummaryRow]]:
    """Run `plan` in `folder` (runs already recorded there as finished are skipped: --resume);
    returns (exit code, comparison directory, one row per full run).

    First the plan's preparation commands (e.g. training a teacher), then its tuning trials, then
    the full runs with each spec's chosen values; writes tuning.csv, summary.csv and the report.
    """
    if not os.path.exists(folder):
        preflight(plan)
    elif plan.tune is not None:
        check_studies(folder, plan)
    where = ComparisonDir(folder)  # the comparison's one directory value, its plan read once
    where.save_plan(plan)
    where.repair_done()
    if describe_budget(plan):
        print(describe_budget(plan), flush=True)
    for i, command in enumerate(plan.prepare or []):
        code = prepared(where, f"prepare/{i}", command)
        if code:
            return code, folder, []
    metric = metric_for(plan.config(plan.labels[0]).data.name)
    chosen = tune(plan, where, metric) if plan.tune is not None else {}
    if chosen is None:
        print("lowband: interrupted (a tuning trial was stopped)", file=sys.stderr)
        return INTERRUPTED, folder, []
    rows: list[SummaryRow] = []
    targets: dict[int, float | None] = {}  # a target budget: the reference's final validation figure per seed
    full = P.full_runs(plan, chosen)
    for i, run in enumerate(full, 1):
        run = aimed(plan, run, targets, metric)
        code, run_dir = execute(where, run, f"run {i}/{len(full)}")
        if code == INTERRUPTED:
            return INTERRUPTED, folder, rows
        if run.label == plan.reference:
            targets[run.seed] = final_val(run_dir, metric) if code == 0 else None
        rows.append(replace(summarize(run.label, run.config, run_dir, code), tuned=run.tuned,
                            step_s=dedicated_step(run.config, folder)))
    add_speed(rows, reference=plan.reference)
    where.write_summary(rows)
    build([where])
    return (0 if all(r.status == "ok" for r in rows) else 1), folder, rows


def tune(plan: P.Plan, where: ComparisonDir, metric: Metric) -> dict[str, dict] | None:
    """Each label's search (lowband.comparison.tuning), tuning.csv rewritten after each; per label the
    chosen values ({}: none finished, or it tunes nothing), or None when interrupted."""
    chosen: dict[str, dict] = {}
    rows: list[TuningRow] = []
    for label in plan.labels:
        if not (plan.tuned or {}).get(label):
            continue
        result = tune_label(where.path, plan, label, metric)
        if result is None:
            return None
        rows += result[0]
        chosen[label] = result[1]
        where.write_tuning(rows)
        if not result[1]:
            print(f"lowband: no trial of {label} finished; it runs with its own settings", file=sys.stderr)
    return chosen


def aimed(plan: P.Plan, run: P.Run, targets: dict[int, float | None], metric: Metric) -> P.Run:
    """Under a target budget, a run other than the reference's stops at its seed's reference figure; when
    the reference has none (it failed), the run trains to its cap and says so."""
    if plan.budget != "target" or run.label == plan.reference:
        return run
    target = targets.get(run.seed)
    if target is None:
        print(f"lowband: {plan.reference} has no final validation figure for seed {run.seed}; {run.label} trains "
              f"to its cap without a target", file=sys.stderr)
        return run
    return P.aim(run, target, metric)


def describe_budget(plan: P.Plan) -> str:
    """'budget samples: single 5 epochs, allreduce 20 epochs' (empty for the default, equal epochs)."""
    if plan.budget == "epochs":
        return ""
    epochs = [f"{run.label} {run.config.train.epochs}" for run in P.full_runs(plan, {})[:len(plan.labels)]]
    if plan.budget == "target":
        return (f"budget target: {plan.reference} runs first, its final validation figure is the target; every "
                f"other method stops when it reaches it or at {plan.factor:g}x {plan.reference}'s samples; "
                "epochs (at most): " + ", ".join(epochs))
    return f"budget {plan.budget} (as many as Allreduce's in train.epochs); epochs: " + ", ".join(epochs)


def preflight(plan: P.Plan) -> None:
    """Every spec's data, shards and model fit (session.check_plan), before the comparison's folder
    is made: bad input leaves no folder behind."""
    for label in plan.labels:
        cfg = plan.config(label)
        session.check_plan(resolve(cfg))
        loggers.check(cfg.train.loggers)


def execute(folder: str | ComparisonDir, run: P.Run, position: str = "") -> tuple[int, str]:
    """Run `run` unless done.jsonl records it finished; an interrupted run continues from its checkpoint.
    `position` ('run 3/12') heads its banner."""
    where = ComparisonDir.of(folder)
    run_dir = where.file(run.dir)
    title = (f"{position}: " if position else "") + run.label + f" seed {run.seed}"
    done = where.finished().get(run.key)
    if done is not None and done["code"] == 0 and RunDir(run_dir).has_records():
        print(f"\n{title}: finished already", flush=True)
        return 0, run_dir
    print(f"\n{title}", flush=True)
    code, run_dir = session.start(run.config, run_dir, resume=RunDir(run_dir).is_run())
    if code != INTERRUPTED:
        where.mark(run.key, run_dir, code)
    return code, run_dir


def prepared(where: ComparisonDir, key: str, command: str) -> int:
    """Run a preparation command unless done.jsonl records it finished."""
    done = where.finished().get(key)
    if done is not None and done["code"] == 0:
        print(f"\n=== prepare: lowband {command}: finished already ===", flush=True)
        return 0
    code = run_prepare(continued(command.replace("{folder}", where.path)))
    if code != INTERRUPTED:
        where.mark(key, "", code)
    return code


def continued(command: str) -> str:
    """`train ... --run-dir D` as `train --resume D` when D holds a started run (an interrupted preparation)."""
    import shlex

    words = shlex.split(command)
    if words[:1] == ["train"] and "--run-dir" in words[:-1]:
        run_dir = words[words.index("--run-dir") + 1]
        if RunDir(run_dir).is_run():
            return f"train --resume {shlex.quote(run_dir)}"
    return command


def final_val(run_dir: str, metric: Metric = ACCURACY) -> float | None:
    """The metric's validation figure in the run's last evaluated record (None: none)."""
    values = [r.value(metric.val_key) for r in read_metrics(run_dir) if r.value(metric.val_key) is not None]
    return values[-1] if values else None


def dedicated_step(cfg: C.Config, folder: str) -> float | None:
    """One worker's step time measured alone (lowband.comparison.calibrate), None when it cannot be measured."""
    try:
        return step_seconds(cfg, folder)
    except Exception as e:  # noqa: BLE001 - the comparison's figures stand without it
        print(f"lowband: could not calibrate {cfg.model.name} alone ({type(e).__name__}: {e}); "
              "no dedicated-machine projection", file=sys.stderr)
        return None


def run_prepare(command: str) -> int:
    """A suite's preparation (`lowband COMMAND`, e.g. its teacher's training): a process that dies with the
    comparison, so a comparison killed while it prepares leaves nothing training into its folder."""
    import shlex


    print(f"\n=== prepare: lowband {command} ===\n(the suite's own settings: the comparison's --set and --epochs do "
          "not apply to it)", flush=True)
    return procs.run([sys.executable, "-m", "lowband", *shlex.split(command)], tied=True).returncode


def summarize(label: str, cfg: C.Config, run_dir: str, code: int) -> SummaryRow:
    """One run's row of summary.csv (final figures of its global model; `final_acc` is test accuracy),
    with its records and link for the comparison table."""
    records = read_metrics(run_dir)
    done = [r for r in records if r.evaluated]
    last, end = (records[-1] if records else EpochRecord(epoch=0)), (done[-1] if done else EpochRecord(epoch=0))
    world = resolve(cfg).world
    return SummaryRow(
        label=label, method=cfg.method.name, seed=cfg.train.seed, workers=world, metric=metric_for(cfg.data.name),
        val_bpb=end.val_bpb, final_bpb=end.test_bpb, link=run_link(cfg.link.rate), corpus_sha256=last.corpus_sha256,
        val_acc=end.val_acc, val_acc_L=end.val_acc_L, final_acc=end.test_acc, final_acc_L=end.test_acc_L,
        best_val_acc=max((r.val_acc for r in done if r.val_acc is not None), default=None),
        epochs=last.epoch, samples=last.samples, bytes_sent_per_worker=last.bytes_sent_per_worker,
        sites=cfg.link.site_count(world), bytes_inter_per_worker=last.inter_or_sent, train_s=last.train_s,
        samples_per_s=median([r.samples_per_s for r in records if r.samples_per_s]),
        status=status_of(code), run_dir=run_dir, records=records)


def time_to(records: list[EpochRecord], key: str, target: float) -> float | None:
    """Training seconds until `key` first reached `target` (None: never)."""
    return next((r.train_s for r in records if r.value(key) is not None and r.value(key) >= target), None)


def add_speed(rows: list[SummaryRow], target: float | None = None, reference: str | None = None) -> None:
    """Give every run the comparison table's speed-up of its label over the `reference` label's (see
    lowband.comparison.table)."""
    by_label = {r.label: r.speedup for r in table.rows(rows, target, reference_of=reference)[0]}
    for r in rows:
        r.speedup = by_label.get(r.label)


def format_table(rows: list[SummaryRow], target: float | None = None, cap: float | None = None,
                 reference: str | None = None) -> str:
    """The comparison table (lowband.comparison.table) of these runs, as plain text, with its target (`cap`:
    a target budget's FACTOR; `reference`: the plan's reference label)."""
    body, target, why = table.rows(rows, target, cap, reference)
    return table.text(body) + "\n\n" + table.describe_target(target, why, table.metric_of(rows))


def print_summary(rows: list[SummaryRow], folder: str, target: float | None = None) -> None:
    where = ComparisonDir(folder)
    print("\n" + format_table(rows, target, where.cap(), where.reference()))
    tuned = dict.fromkeys(f"{r.label} {r.tuned}" for r in rows if r.tuned)
    word = table.metric_of(rows).name
    if tuned:
        print(f"\nTuned (the best finished trial's final validation {word}, tuning.csv): " + "; ".join(tuned))
    print("\n" + "\n".join(verdict([where], target)))
    print(f"\nruns, summary.csv and report.md/report.html (plots: {word} against epoch, bytes and time; "
          f"projected time to target against link rate; {word} against bytes) in {folder}")
