"""Tuning on Optuna without training: which trial is chosen, what tuning.csv holds, which field the report
plots against, a study file from another comparison, and the command line's bad --tune and --budget input."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from lowband.cli import main
from lowband.comparison import plan as P
from lowband.comparison import tuning as T
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.space import parse_tune
from lowband.comparison.summary import TuningRow
from lowband.comparison.tuning_report import important, spearman
from lowband.data.metric import ACCURACY, BITS_PER_BYTE
from lowband.errors import ConfigError


def row(trial, val, status="ok", lr=0.1, tau=8):
    return TuningRow(label="diloco", method="diloco", trial=trial, field="optim.lr method.tau", value=f"{lr} {tau}",
                     val=val, status=status)


def test_a_pruned_diverged_or_failed_trial_is_never_chosen_even_with_the_best_figure():
    rows = [row(0, 0.70), row(1, 0.95, "pruned"), row(2, 0.99, "diverged"), row(3, 0.98, "failed (1)"),
            row(4, 0.72), row(5, 0.72), row(6, 0.97, "interrupted")]
    assert T.choose(rows, ACCURACY) is rows[4]  # the best finished trial; a tie keeps the first
    loss = [row(0, 1.9), row(1, 1.2, "pruned"), row(2, 1.7), row(3, None)]
    assert T.choose(loss, BITS_PER_BYTE) is loss[2]  # lower is better; a trial without a figure is passed over
    assert T.choose([row(0, 0.9, "pruned"), row(1, None, "failed (1)")], ACCURACY) is None  # none finished


def plan(tmp_path, specs=("allreduce", "local_sgd:tau=4"), tune=("optim.lr=0.01:0.2", "method.tau=2,8")):
    return P.make_plan(list(specs), {"train": {"workers": 2, "epochs": 3}}, {}, str(tmp_path),
                       tune=parse_tune(list(tune), 2, trials=3))


def test_the_study_records_every_trial_and_tuning_csv_marks_the_chosen_one(tmp_path):
    p = plan(tmp_path)
    study = T.open_study(str(tmp_path), p, "local_sgd:tau=4", ACCURACY)
    outcomes = [T.Outcome("ok", 0.80, 2), T.Outcome("pruned", 0.95, 1), T.Outcome("diverged", None, 1),
                T.Outcome("ok", 0.85, 2)]
    for outcome in outcomes:
        trial = study.ask()
        values = T.suggest(trial, p.tune, p.tuned["local_sgd:tau=4"])
        assert 0.01 <= values["optim.lr"] <= 0.2 and values["method.tau"] in (2, 8)
        trial.set_user_attr("dir", f"tune/local_sgd_tau-4/trial-{trial.number:03d}")
        T.finish(study, trial, outcome)
    rows = T.tuning_rows(study, "local_sgd:tau=4", p, ACCURACY)
    assert [(r.trial, r.status, r.val, r.epochs, r.chosen) for r in rows] == [
        (0, "ok", 0.80, 2, "no"), (1, "pruned", 0.95, 1, "no"), (2, "diverged", None, 1, "no"), (3, "ok", 0.85, 2, "yes")]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "FAIL", "COMPLETE"]
    assert rows[3].values == {"optim.lr": rows[3].value.split()[0], "method.tau": rows[3].value.split()[1]}
    folder = ComparisonDir(str(tmp_path))
    folder.write_tuning(rows)
    assert folder.read_tuning() == rows  # tuning.csv round-trips through TuningRow
    assert T.counted(study) == 4


def test_an_interrupted_trial_is_marked_failed_and_retried_with_its_values_and_directory(tmp_path):
    p = plan(tmp_path)
    study = T.open_study(str(tmp_path), p, "allreduce", ACCURACY)
    trial = study.ask()
    values = T.suggest(trial, p.tune, ["optim.lr"])
    trial.set_user_attr("dir", "tune/allreduce/trial-000")  # then the comparison was killed: still running
    again = T.open_study(str(tmp_path), p, "allreduce", ACCURACY)
    T.retry_interrupted(again)
    retry = again.ask()
    assert T.suggest(retry, p.tune, ["optim.lr"]) == values and retry.user_attrs["dir"] == "tune/allreduce/trial-000"
    first = again.trials[0]
    assert first.state.name == "FAIL" and retry.user_attrs["retry_of"] == first.number and T.counted(again) == 0
    rows = T.tuning_rows(again, "allreduce", p, ACCURACY)
    assert [r.status for r in rows] == ["interrupted"]  # the report names it; never chosen


def test_a_study_file_of_another_comparison_is_refused_in_one_line(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    T.open_study(str(theirs), plan(theirs), "allreduce", ACCURACY)
    p = plan(ours, tune=("optim.lr=0.01:0.2",))
    T.check_studies(str(ours), p)  # no tuning.db yet: nothing to check
    T.open_study(str(ours), p, "allreduce", ACCURACY)
    T.check_studies(str(ours), p)  # its own
    os.replace(theirs / "tuning.db", ours / "tuning.db")
    with pytest.raises(ConfigError, match="tuning.db.*of another comparison"):
        T.check_studies(str(ours), p)


def test_the_plot_uses_the_field_that_ranks_the_finished_trials_best():
    assert spearman([(1, 1), (2, 2), (3, 3)]) == pytest.approx(1.0)
    assert spearman([(1, 3), (2, 2), (3, 1)]) == pytest.approx(-1.0)
    assert spearman([(1, 1), (1, 2), (1, 3)]) == 0.0  # a constant side
    rows = [row(0, 0.5, lr=0.01, tau=8), row(1, 0.6, lr=0.02, tau=2), row(2, 0.7, lr=0.03, tau=8),
            row(3, 0.8, lr=0.04, tau=2), row(4, 0.1, "pruned", lr=0.5, tau=2)]
    assert important(rows, ["method.tau", "optim.lr"]) == "optim.lr"  # the pruned trial is left out


@pytest.mark.parametrize("args, message", [
    (["--tune", "method.nope=1,2"], "--tune='method.nope' is invalid: no method of this comparison has that field"),
    (["--tune", "optim.lr=0.2:0.1"], "0.2 is not below 0.1"),
    (["--tune", "optim.lr=log:0:0.1"], "a log range needs 0 < LO"),
    (["--tune", "optim.lr=0.1,0.2", "--tune-trials", "0"], "--tune-trials=0"),
    (["--tune-trials", "3"], "--tune-trials shapes --tune's search"),
    (["--tune-on", "3"], "--tune-on shapes --tune's search"),
    (["--tune", "optim.lr=0.1,0.2", "--tune-on", "-1"], "--tune-on=-1"),
    (["--budget", "target:0.5"], "FACTOR must be a number in [1, 100]"),
    (["--budget", "target", "--methods", "single,local_sgd"], "needs the reference method allreduce")])
def test_bad_tuning_and_budget_input_is_one_line_exit_2_and_no_folder(tmp_path, capsys, args, message):
    out = tmp_path / "comparisons"
    methods = [] if "--methods" in args else ["--methods", "allreduce,local_sgd"]
    assert main(["compare", *methods, "--workers", "2", "--epochs", "1", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_resuming_with_another_comparisons_study_file_exits_2_and_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "compare-x"
    p = plan(folder, tune=("optim.lr=0.01:0.2",))
    ComparisonDir(str(folder)).save_plan(p)
    other = tmp_path / "other"
    other.mkdir()
    T.open_study(str(other), plan(other), "allreduce", ACCURACY)
    os.replace(other / "tuning.db", folder / "tuning.db")
    before = {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)}
    assert main(["compare", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tuning.db" in err and "another comparison" in err, err
    assert {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)} == before


def test_a_grid_runs_every_combination_once_then_stops_without_optunas_optimize_loop(tmp_path):
    p = plan(tmp_path, specs=("local_sgd",), tune=("optim.lr=0.1,0.2", "method.tau=2,8"))
    p.tune = replace(p.tune, sampler="grid")
    assert p.tune.is_grid() and p.tune.trial_count(p.tuned["local_sgd"]) == 3  # --tune-trials 3 of 4 cells
    study = T.open_study(str(tmp_path), p, "local_sgd", ACCURACY)
    seen = []
    for _ in range(4):
        trial = study.ask()
        seen.append(tuple(T.suggest(trial, p.tune, p.tuned["local_sgd"]).values()))
        T.finish(study, trial, T.Outcome("ok", 0.5, 2))
    assert sorted(seen) == [(0.1, 2), (0.1, 8), (0.2, 2), (0.2, 8)]


class Condemning:
    """A trial whose pruner condemns every epoch; it remembers what was reported."""

    def __init__(self):
        self.reported = []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return True


def test_the_watch_reports_each_epoch_once_and_judges_only_while_the_trial_runs(tmp_path):
    import json

    lines = [{"epoch": e, "val_acc": v, "time": {"epoch_train_s": 1.0}} for e, v in ((1, 0.2), (2, 0.4), (3, 0.5))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[:1]))
    trial = Condemning()
    watch = T.Pruning(trial, ACCURACY, 3, str(tmp_path))
    watch.read()
    assert (watch.pruned, watch.epoch, watch.val, trial.reported) == (True, 1, 0.2, [(1, 0.2)])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    ended = T.Pruning(Condemning(), ACCURACY, 3, str(tmp_path))
    ended.read(judge=False)  # a trial that ended by itself: its final figure, whatever the pruner thinks
    assert (ended.pruned, ended.epoch, ended.val) == (False, 3, 0.5)
    assert ended.trial.reported == [(1, 0.2), (2, 0.4), (3, 0.5)]


def test_values_a_finished_trial_ran_are_not_run_again_nor_counted_nor_chosen(tmp_path, monkeypatch):
    p = plan(tmp_path, specs=("allreduce",), tune=("optim.lr=0.1,0.2",))
    p.tune = replace(p.tune, sampler="tpe", trials=2)  # TPE over a list may propose a value twice
    study = T.open_study(str(tmp_path), p, "allreduce", ACCURACY)
    first = study.ask()
    T.suggest(first, p.tune, ["optim.lr"])
    first.set_user_attr("dir", "tune/allreduce/trial-000")
    T.finish(study, first, T.Outcome("ok", 0.9, 2))
    again = study.ask()
    assert T.repeat(study, again, dict(first.params))  # told the earlier result, not run
    assert not T.repeat(study, study.ask(), {"optim.lr": 0.3 if first.params["optim.lr"] != 0.3 else 0.4})
    assert T.counted(study) == 1
    rows = T.tuning_rows(study, "allreduce", p, ACCURACY)
    assert (rows[1].status, rows[1].val, rows[1].run_dir) == ("repeat of trial 0", 0.9, "tune/allreduce/trial-000")
    assert [r.chosen for r in rows] == ["yes", "no"]


def test_tuning_csv_has_a_column_per_field_and_the_plot_a_panel_per_field(tmp_path, monkeypatch):
    import csv

    from lowband.comparison import plots, tuning_report

    rows = [row(0, 0.70, lr=0.1, tau=8), row(1, 0.80, lr=0.2, tau=16), row(2, 0.60, "pruned", lr=0.05, tau=8)]
    rows[1].chosen = "yes"
    folder = ComparisonDir(str(tmp_path))
    folder.write_tuning(rows)
    with open(folder.tuning_path, newline="") as f:
        read = list(csv.DictReader(f))
    assert [(r["optim.lr"], r["method.tau"]) for r in read] == [("0.1", "8"), ("0.2", "16"), ("0.05", "8")]
    assert folder.read_tuning() == rows  # the extra columns leave the rows as they were
    drawn = {}
    monkeypatch.setattr(plots, "tuning", lambda panels, *args: drawn.update(panels))
    tuning_report.section(rows, str(tmp_path))
    assert set(drawn) == {"optim.lr", "method.tau"}
    assert sorted(drawn["method.tau"]) == [(8.0, 0.6, "pruned", False), (8.0, 0.7, "ok", False), (16.0, 0.8, "ok", True)]


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_search_whose_trials_have_one_epoch_says_they_are_never_pruned(tmp_path, monkeypatch, capsys, epochs):
    p = P.make_plan(["local_sgd"], {"train": {"workers": 2, "epochs": 3}}, {}, str(tmp_path),
                    tune=parse_tune(["optim.lr=0.1,0.2"], epochs))
    monkeypatch.setattr(T, "run_trial", lambda folder, run, trial, metric: T.Outcome("ok", 0.5, epochs))
    T.tune_label(str(tmp_path), p, "local_sgd", ACCURACY)
    said = "local_sgd: trials of one epoch are never pruned" in capsys.readouterr().out
    assert said == (epochs == 1)


@pytest.mark.parametrize("outcome", [T.Outcome("pruned", 0.91, 1), T.Outcome("failed (1)", None, 1),
                                     T.Outcome("ok", 0.88, 2)])
def test_values_a_finished_trial_ran_are_not_run_again_whatever_its_end(tmp_path, outcome):
    """A sampler proposing the values of a pruned, failed or complete trial again: the new trial is told the
    earlier result and marked a repeat, not run (and not counted); its state is the earlier one's."""
    p = plan(tmp_path, specs=("allreduce",), tune=("optim.lr=0.05,0.1",))
    study = T.open_study(str(tmp_path), p, "allreduce", ACCURACY)
    first = study.ask()
    values = T.suggest(first, p.tune, ["optim.lr"])
    first.set_user_attr("dir", "tune/allreduce/trial-000")
    T.finish(study, first, outcome)
    again = study.ask()
    again.set_user_attr("probe", True)
    assert T.repeat(study, again, values) is True
    done = study.trials[-1]
    assert done.user_attrs["repeat_of"] == 0 and done.state == study.trials[0].state and T.counted(study) == 1


@pytest.mark.parametrize("kind", ["directory", "link-to-dev-null", "locked"])
def test_a_tuning_db_that_is_no_study_file_or_is_locked_is_one_line(tmp_path, kind):
    """A directory, a link to /dev/null: not a study file (no sqlalchemy traceback). A study another process
    holds locked: said as locked, with the advice to wait, not to move it away (which would lose it)."""
    import sqlite3

    p = plan(tmp_path, tune=("optim.lr=0.01:0.2",))
    db = tmp_path / "tuning.db"
    if kind == "directory":
        db.mkdir()
    elif kind == "link-to-dev-null":
        db.symlink_to("/dev/null")
    else:
        T.open_study(str(tmp_path), p, "allreduce", ACCURACY)
        holder = sqlite3.connect(str(db), timeout=0)
        holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(ConfigError, match="^tuning.db=") as e:
            T.check_studies(str(tmp_path), p)
    finally:
        if kind == "locked":
            holder.rollback()
            holder.close()
    said = str(e.value)
    assert "\n" not in said and ("locked by another process" in said) == (kind == "locked")
    assert ("move it away" in said) == (kind != "locked")


def test_tune_on_trains_every_trial_on_its_seed_and_the_published_runs_on_others(tmp_path):
    """--tune-on 0 --seeds 10,11: the trials train on seed 0, the full runs on 10 and 11, plan.json keeps it (a
    resumed comparison re-plans the same), and the report says the published runs informed no choice."""
    from lowband.comparison.tuning_report import seeds_said

    held = P.make_plan(["allreduce"], {"train": {"workers": 2, "epochs": 3}}, {}, str(tmp_path / "held"),
                       seeds=[10, 11], tune=parse_tune(["optim.lr=0.1,0.2"], 2, train_seed=0))
    trial = P.trial_run(held, "allreduce", 0, {"optim.lr": 0.1})
    assert trial.seed == 0 and trial.config.train.seed == 0
    assert [r.seed for r in P.full_runs(held, {"allreduce": {"optim.lr": 0.1}})] == [10, 11]
    assert P.Plan.from_json(held.to_json()).tune.train_seed == 0
    inside = replace(held, tune=replace(held.tune, train_seed=None))  # the default: the first of --seeds
    assert P.trial_run(inside, "allreduce", 0, {"optim.lr": 0.1}).seed == 10
    folders = []
    for name, p in (("held", held), ("inside", inside)):
        folder = ComparisonDir(str(tmp_path / name))
        folder.save_plan(p)
        folders.append(folder)
    said = seeds_said(folders)
    assert "trained on seed 0; the results above are on seeds 10, 11, which informed no choice" in said[0]
    assert "trained on seed 10, which is also one of the results' seeds (10, 11)" in said[1] and "in-sample" in said[1]
    assert seeds_said([ComparisonDir(str(tmp_path / "none"))]) == []  # no plan, or no tuning: nothing said


def test_the_supervisor_stops_a_trial_the_pruner_condemns_and_says_nothing_of_one_that_failed(tmp_path, capsys):
    """Tuning watches a trial with launch.supervise and its own policy (Pruning): a condemned trial is
    stopped (SIGTERM), a trial that fails by itself ends the watch with its code and no churn line."""
    import json
    import signal

    from lowband import procs
    from lowband.run import launch

    record = {"epoch": 1, "val_acc": 0.2, "time": {"epoch_train_s": 1.0}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    running = procs.start(["sleep", "60"])
    watch = T.Pruning(Condemning(), ACCURACY, 3, str(tmp_path))
    assert launch.supervise([running], watch=watch) == -signal.SIGTERM
    assert watch.pruned and running.poll() == -signal.SIGTERM
    failing = procs.start(["sh", "-c", "exit 4"])
    calm = T.Pruning(Condemning(), ACCURACY, 3, str(tmp_path / "none"))
    assert launch.supervise([failing], watch=calm) == 4 and not calm.pruned
    assert capsys.readouterr().err == ""
