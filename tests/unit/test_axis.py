"""The axis search (lowband.comparison.axis) and what the report says of a search's coverage
(lowband.comparison.coverage), driven through lowband's own study with a table in place of training."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from lowband.cli import main
from lowband.comparison import coverage
from lowband.comparison import plan as P
from lowband.comparison import tuning as T
from lowband.comparison.axis import AxisSampler, sweep_size
from lowband.comparison.space import Param, parse_tune
from lowband.comparison.summary import TuningRow
from lowband.data.metric import ACCURACY

LRS, TAUS = (0.02, 0.05, 0.1, 0.2), (2, 8, 32)


def separable(lr, tau):
    """Accuracy whose best lr (0.05) is the same at every tau, and whose best tau (2) the same at every lr."""
    return 0.6 - 10 * abs(lr - 0.05) - 0.002 * tau


def search(tmp_path, monkeypatch, table, trials=None, seed=0, outcome=None):
    """lowband's own search of the label over LRS x TAUS (tuning.tune_label), each trial scored by
    `table(lr, tau)` instead of trained; (the settings in the order run, the tuning rows)."""
    p = P.make_plan(["local_sgd"], {"train": {"workers": 2, "epochs": 2}}, {}, str(tmp_path),
                    tune=parse_tune(["optim.lr=" + ",".join(map(str, LRS)), "method.tau=" + ",".join(map(str, TAUS))],
                                    2, trials=trials, seed=seed))
    assert p.tune.sampler_name(p.tuned["local_sgd"]) == "axis"  # the default over lists
    seen = []

    def scored(folder, run, trial, metric):
        seen.append((run.values["optim.lr"], run.values["method.tau"]))
        return (outcome or (lambda lr, tau: T.Outcome("ok", table(lr, tau), 2)))(*seen[-1])

    monkeypatch.setattr(T, "run_trial", scored)
    rows, _ = T.tune_label(str(tmp_path), p, "local_sgd", ACCURACY)
    return seen, rows


def test_the_search_polls_the_middle_moves_to_the_best_and_ends_at_a_local_optimum(tmp_path, monkeypatch):
    seen, rows = search(tmp_path, monkeypatch, separable)
    assert seen == [(0.1, 8), (0.02, 8), (0.05, 8), (0.2, 8), (0.1, 2), (0.1, 32),  # the middle and its poll
                    (0.05, 2),  # the best, (0.05, 8), polled: (0.05, 2) is better, so the search moves there
                    (0.02, 2), (0.2, 2), (0.05, 32)]  # its poll finds nothing better: the search ends
    brute = max(itertools.product(LRS, TAUS), key=lambda s: separable(*s))  # every setting scored
    assert [r.value for r in rows if r.is_chosen] == [f"{brute[0]:g} {brute[1]}"]
    assert sweep_size({"lr": LRS, "tau": TAUS}) == 6  # the first poll


def test_a_variants_after_poll_setting_runs_once_the_centres_poll_is_done(tmp_path, monkeypatch):
    class Diagonal(AxisSampler):  # a pattern move of sorts: one setting two fields away from the middle
        def after_poll(self, center, trials, maximize):
            return (0.02, 32) if center == (0.1, 8) else None

    monkeypatch.setattr(T, "sampler", lambda tune, fields: Diagonal({f: list(tune.param(f).values) for f in fields}))
    seen, _ = search(tmp_path, monkeypatch, separable)
    assert seen[:7] == [(0.1, 8), (0.02, 8), (0.05, 8), (0.2, 8), (0.1, 2), (0.1, 32), (0.02, 32)]
    assert len(seen) == len(set(seen))  # run once: the search then goes on as the axis search does


def test_past_a_local_optimum_every_other_setting_runs_once_in_a_seeded_order(tmp_path, monkeypatch):
    def trap(lr, tau):  # the middle is best along both fields; the true best sits diagonally away
        return 0.9 if (lr, tau) == (0.02, 32) else 0.5 if (lr, tau) == (0.1, 8) else 0.1

    (tmp_path / "own").mkdir()
    assert len(search(tmp_path / "own", monkeypatch, trap)[0]) == 6  # left to itself it ends after the poll
    runs = []
    for i, seed in enumerate((0, 0, 1)):
        (tmp_path / str(i)).mkdir()
        runs.append(search(tmp_path / str(i), monkeypatch, trap, trials=12, seed=seed)[0])
    assert runs[0] == runs[1]  # the same seed, the same order
    assert runs[0][:6] == runs[2][:6] and runs[0][6:] != runs[2][6:]  # the seed only orders the rest
    for seen in runs:
        assert sorted(seen) == sorted(itertools.product(LRS, TAUS))  # no setting twice, none missed


def test_a_pruned_or_failed_trial_never_becomes_the_setting_the_search_moves_to(tmp_path, monkeypatch):
    def outcome(lr, tau):  # 0.02 looks best but was stopped; 0.2 failed
        if lr == 0.02:
            return T.Outcome("pruned", 0.99, 1)
        return T.Outcome("failed (1)", None, 1) if lr == 0.2 else T.Outcome("ok", separable(lr, tau), 2)

    seen, _ = search(tmp_path, monkeypatch, separable, outcome=outcome)
    assert seen[6] == (0.05, 2)  # the second poll is around the best complete trial, (0.05, 8)


def test_the_sampler_alone_picks_the_same_setting_from_the_same_results():
    sampler = AxisSampler({"a": [1, 2, 3], "b": ["x", "y"]}, seed=5)
    assert sampler.next_setting([], maximize=True) == {"a": 2, "b": "y"}  # the (upper) middle of each list
    assert sampler.neighbours((2, "y")) == [(1, "y"), (3, "y"), (2, "x")]


def rows_of(settings, chosen, statuses=None):
    statuses = statuses or {}
    return [TuningRow(label="m", method="m", trial=i, field="optim.lr method.tau", value=f"{lr:g} {tau}",
                      val=0.5, status=statuses.get((lr, tau), "ok"), chosen="yes" if (lr, tau) == chosen else "no")
            for i, (lr, tau) in enumerate(settings)]


def test_the_report_counts_tried_pruned_and_never_tried_settings_and_names_untried_neighbours():
    params = [Param("optim.lr", LRS), Param("method.tau", TAUS, integer=True)]
    settings = [(0.1, 8), (0.02, 8), (0.05, 8), (0.2, 8), (0.1, 2)]
    lines = coverage.sentences(rows_of(settings, (0.1, 2), {(0.02, 8): "pruned"}), params, "axis")
    assert lines[0].endswith("12 settings; tried 5 (1 pruned), never tried 7.")
    assert lines[1].startswith("Edge: the chosen method.tau=2 is the low end")  # the smallest of 3 taus
    assert "optim.lr=0.02; optim.lr=0.05; optim.lr=0.2; method.tau=32" in lines[2]
    done = coverage.sentences(rows_of(settings + [(0.1, 32)], (0.1, 8)), params, "axis")
    assert done[-1].startswith("Every one-field change of the chosen setting was tried")
    assert "among the 6 never tried" in done[-1] and "--tune-sampler grid" in done[-1]  # 12 settings, 6 ran
    assert "CPU s more" not in done[-1]  # no trial's CPU known: no estimate
    assert not any(line.startswith("Edge") for line in done)  # 0.1 and 8 are inside their lists


def test_the_local_caveat_prices_the_settings_never_tried_and_is_silent_after_a_whole_grid():
    params = [Param("optim.lr", [0.1, 0.2]), Param("method.tau", [2, 8], integer=True)]
    rows = rows_of([(0.1, 8), (0.2, 8), (0.1, 2)], (0.1, 8), {(0.2, 8): "pruned"})
    for row, cpu in zip(rows, (3.0, 1.0, 5.0), strict=True):
        row.cpu_s = cpu
    line = coverage.sentences(rows, params, "axis")[-1]
    assert "among the 1 never tried" in line and "about 4 CPU s more" in line  # the finished trials' mean: 4 s
    every = rows_of([(0.1, 8), (0.2, 8), (0.1, 2), (0.2, 2)], (0.1, 8))
    assert coverage.sentences(every, params, "axis")[-1].endswith("it is the best along each field.")


def test_the_space_sentence_adds_the_trials_cpu_when_every_trial_counted_it():
    params = [Param("optim.lr", LRS), Param("method.tau", TAUS, integer=True)]
    rows = rows_of([(0.1, 8), (0.02, 8), (0.1, 2)], (0.1, 2))
    for row, cpu in zip(rows, (1.25, 2.5, 0.75), strict=True):
        row.cpu_s = cpu
    assert coverage.sentences(rows, params)[0].endswith("never tried 9; 4 CPU s in all.")  # 4.5 s, rounded
    rows[1].cpu_s = None  # a trial from a study before lowband counted CPU: no total rather than a wrong one
    assert coverage.sentences(rows, params)[0].endswith("never tried 9.")


@pytest.mark.parametrize(("param", "value", "side"), [
    (Param("optim.lr", low=1e-4, high=1e-1, log=True), 1.5e-4, "low"),  # the outer tenth on a log scale
    (Param("optim.lr", low=1e-4, high=1e-1, log=True), 3e-3, ""),  # linearly near the low end, not on a log scale
    (Param("method.outer_lr", low=0.3, high=1.0), 0.95, "high"),
    (Param("method.outer_lr", (0.5, 0.9)), 0.5, ""),  # a list of two has no inside: no warning
])
def test_an_edge_is_the_end_of_a_list_of_three_or_the_outer_tenth_of_a_range(param, value, side):
    assert coverage.edge_side(param, value) == side


def test_the_axis_search_over_a_range_is_refused_in_one_line(tmp_path, capsys):
    code = main(["compare", "--methods", "single", "--tune", "optim.lr=0.01:0.1", "--tune-sampler", "axis",
                 "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--tune-sampler" in err and "axis" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_grid_asked_for_runs_every_setting_and_the_axis_search_at_most_as_many(tmp_path):
    tune = parse_tune(["optim.lr=0.1,0.2", "method.tau=2,8"], sampler="grid")
    p = P.make_plan(["local_sgd"], {"train": {"workers": 2}}, {}, str(tmp_path), tune=tune)
    assert p.tune.trial_count(p.tuned["local_sgd"]) == 4
    assert replace(p.tune, sampler="auto").trial_count(p.tuned["local_sgd"]) == 4  # a cap: it ends by itself


def test_the_median_pruner_decides_nothing_before_three_quarters_of_a_trials_epochs(tmp_path):
    """Two finished trials at 0.5 every epoch; a third far behind is left alone at epochs 1 and 2 of 4, stopped
    at 3."""
    assert [T.warm_up(e) for e in (1, 2, 3, 4, 8, 10)] == [1, 1, 2, 3, 6, 8]
    p = P.make_plan(["local_sgd"], {"train": {"workers": 2, "epochs": 4}}, {}, str(tmp_path),
                    tune=parse_tune(["optim.lr=0.1:0.2"]))
    study = T.open_study(str(tmp_path), p, "local_sgd", ACCURACY)
    for _ in range(2):
        trial = study.ask()
        for epoch in (1, 2, 3, 4):
            trial.report(0.5, epoch)
        study.tell(trial, 0.5)
    behind = study.ask()
    assert not T.judged(behind, 1, 0.01, 4)  # epochs 1 and 2: the warm-up
    assert not T.judged(behind, 2, 0.01, 4)
    assert T.judged(behind, 3, 0.01, 4)  # epoch 3 of 4: three quarters of the trial, judged and stopped


def test_no_private_optuna_api_is_used():
    """lowband talks to Optuna through its public API only (the axis search samples a whole setting through
    relative sampling, a retried trial names the one it retries): a private attribute would break silently
    on an Optuna upgrade."""
    import pathlib
    import re

    src = pathlib.Path(__file__).resolve().parents[2] / "src" / "lowband"
    private = re.compile(r"\._trial_id\b|\._storage\b|\._study_id\b|optuna\._\w+")
    found = [f"{p.relative_to(src)}:{n}" for p in src.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert not found, found
