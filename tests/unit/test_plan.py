"""A comparison's plan: --seeds and --tune parsing, per-method settings, the runs it implies, resume records."""

import math

import pytest

from lowband import config as C
from lowband.comparison import plan as P
from lowband.comparison.folder import ComparisonDir
from lowband.comparison.space import Param, Tune, parse_tune
from lowband.data.metric import ACCURACY, BITS_PER_BYTE
from lowband.errors import ConfigError
from lowband.training import runconfig
from lowband.training.spec import resolve


def test_seeds_are_distinct_non_negative_integers():
    assert P.parse_seeds("0,1,2") == [0, 1, 2] and P.parse_seeds(" 7 ") == [7]
    assert len(P.parse_seeds(",".join(map(str, range(P.MAX_RUNS_LISTED))))) == P.MAX_RUNS_LISTED
    for bad in ("", "a", "-1", "0,,1", "1.5", "0,0", ",".join(map(str, range(P.MAX_RUNS_LISTED + 1)))):
        with pytest.raises(ConfigError, match="--seeds"):
            P.parse_seeds(bad)


def test_a_comparison_lists_at_most_max_runs_listed_method_specs_each_once():
    with pytest.raises(ConfigError, match=r"--methods='101 specs: diloco:tau=1,diloco:tau=2,.*\.\.\.' is invalid: "
                                          r"at most 100 specs, each once"):
        plan([f"diloco:tau={t}" for t in range(1, P.MAX_RUNS_LISTED + 2)])
    with pytest.raises(ConfigError, match=r"--methods='3 specs: allreduce,diloco,allreduce' is invalid: at most 100 "
                                          r"specs, each once"):
        plan(["allreduce", "diloco", "allreduce"])


def test_tune_lists_log_spacing_and_ranges():
    assert parse_tune("optim.lr=0.025,0.05,0.1").params == (Param("optim.lr", (0.025, 0.05, 0.1)),)
    assert parse_tune("optim.lr=0.1,0.1,0.2", 3) == Tune((Param("optim.lr", (0.1, 0.2)),), 3)
    assert parse_tune("optim.lr=log:0.01:1:3").params[0].values == pytest.approx((0.01, 0.1, 1.0))
    assert parse_tune("optim.lr=log:0.01:0.1:3").params[0].values == (0.01, 0.03162, 0.1)  # 10^-1.5, 4 digits
    tune = parse_tune(["optim.lr=log:1e-3:1e-2", "method.outer_lr=0.3:1.0", "method.tau=8,16,32"], trials=6)
    assert tune.params == (Param("optim.lr", low=1e-3, high=1e-2, log=True), Param("method.outer_lr", low=0.3, high=1.0),
                           Param("method.tau", (8.0, 16.0, 32.0)))
    assert tune.sampler_name() == "tpe" and tune.trial_count(tune.fields) == 6
    grid = parse_tune(["optim.lr=0.1,0.2,0.3", "method.tau=8,16"])
    assert grid.sampler_name() == "axis" and grid.trial_count(grid.fields) == 6  # at most every combination
    assert parse_tune(["optim.lr=0.1,0.2"], sampler="grid").sampler_name() == "grid"
    assert grid.trial_count(["optim.lr"]) == 3 and parse_tune(["optim.lr=1,2"], trials=9).trial_count(["optim.lr"]) == 2


@pytest.mark.parametrize("bad, message", [
    ("optim.lr", "expected"), ("optim.lr=", "expected"), ("lr=0.1", "expected"), ("optim.lr=a,0.1", "not a number"),
    ("optim.lr=0.1,nan", "not a number"), ("optim.lr=log:0:1:3", "0 < LO"), ("optim.lr=log:-1:1:3", "0 < LO"),
    ("optim.lr=log:0.2:0.1:3", "0 < LO < HI"), ("optim.lr=log:0.1:1:1", "N in [2, 1000]"),
    ("optim.lr=log:0.1:1:x", "N in [2, 1000]"), ("optim.lr=log:1e-3:1e-2:1000000000", "N in [2, 1000]"),
    ("optim.lr=0.2:0.1", "0.2 is not below 0.1"), ("optim.lr=0.1:0.1", "LO < HI"),
    ("optim.lr=log:0:0.1", "0 is not above 0"), ("optim.lr=log:-1:0.1", "not above 0"), ("optim.lr=1:2:3:4", "expected"),
    ("optim.lr=log:1e-3:1e-2:\u00b2", "N in [2, 1000]")])  # '²' is a digit to str.isdigit, not to int()
def test_bad_tune_specs(bad, message):
    with pytest.raises(ConfigError, match="--tune") as e:
        parse_tune(bad)
    assert message in str(e.value) and bad in str(e.value)  # one line: the option, the value, what is allowed


@pytest.mark.parametrize("option, kwargs, message", [
    ("--tune-epochs", {"epochs": 0}, "must be in [1, 10000]"), ("--tune-epochs", {"epochs": 1_000_000_000}, "10000"),
    ("--tune-trials", {"trials": 0}, "must be in [1, 1000]"),
    ("--tune-trials", {"trials": 1_000_000_000}, "must be in [1, 1000]"),
    ("--tune-sampler", {"sampler": "bayes"}, "one of 'auto', 'axis', 'grid'"), ("--tune-pruner", {"pruner": "hyper"}, "median"),
    ("--tune-seed", {"seed": -1}, "[0, 4294967296)"), ("--tune-seed", {"seed": 99999999999999999999999}, "[0, 4294967296)"),
    ("--tune-on", {"train_seed": -1}, "[0, 4294967296)"), ("--tune-on", {"train_seed": 2**32}, "[0, 4294967296)"),
    ("--tune", {"texts": ["optim.lr=0.1", "optim.lr=0.2"]}, "at most once")])
def test_bad_tune_options(option, kwargs, message):
    texts = kwargs.pop("texts", ["optim.lr=0.1,0.2"])
    with pytest.raises(ConfigError, match=option) as e:
        parse_tune(texts, **kwargs)
    assert message in str(e.value)
    with pytest.raises(ConfigError, match="--tune-sampler.*a grid needs every"):
        parse_tune(["optim.lr=0.1:0.2"], sampler="grid")


def plan(specs, tune=None, seeds=None, base=None, overrides=None, per_method=None):
    base = base if base is not None else {"train": {"workers": 2, "epochs": 5}}
    return P.make_plan(specs, base, overrides or {}, "F", seeds=seeds, tune=parse_tune(tune, 2) if tune else None,
                       suite={"per_method": per_method})


def test_per_method_settings_sit_between_the_suite_and_the_command_line():
    per_method = {"local_sgd": {"optim": {"lr": 0.2, "momentum": 0.5}, "method": {"tau": 8}},
                  "local_sgd:tau=4": {"optim": {"lr": 0.3}}}
    p = plan(["allreduce", "local_sgd", "local_sgd:tau=4", "local_sgd:tau=16"],
             overrides={"optim": {"momentum": 0.8}}, per_method=per_method)
    lr = {label: raw.get("optim", {}).get("lr") for label, raw in p.configs.items()}
    assert lr == {"allreduce": None, "local_sgd": 0.2, "local_sgd:tau=4": 0.3, "local_sgd:tau=16": 0.2}
    assert {raw["optim"]["momentum"] for raw in p.configs.values()} == {0.8}  # the command line wins
    assert [p.configs[s]["method"].get("tau") for s in ("local_sgd", "local_sgd:tau=4")] == [8, 4]  # spec wins
    with pytest.raises(ConfigError, match="optim.lrr"):
        plan(["allreduce"], per_method={"allreduce": {"optim": {"lrr": 0.1}}})
    with pytest.raises(ConfigError, match="per_method.local_sdg.*names no method"):
        plan(["allreduce"], per_method={"local_sdg": {"optim": {"lr": 0.1}}})


def test_trials_set_their_values_and_the_first_seed_then_each_seed_runs_once_with_the_chosen_values():
    p = plan(["allreduce", "local_sgd:tau=4"], ["optim.lr=0.05:0.2", "method.tau=2,8"], seeds=[3, 4])
    assert p.tuned == {"allreduce": ["optim.lr"], "local_sgd:tau=4": ["optim.lr", "method.tau"]}  # tau: who has it
    trial = P.trial_run(p, "local_sgd:tau=4", 7, {"optim.lr": 0.1, "method.tau": 8})
    assert (trial.config.optim.lr, trial.config.method.tau, trial.config.train.seed,
            trial.config.train.epochs) == (0.1, 8, 3, 2)
    assert trial.dir == "tune/local_sgd_tau-4/trial-007" and trial.tuned == "optim.lr=0.1 method.tau=8"
    assert P.trial_run(p, "allreduce", 8, {"optim.lr": 0.1}, "tune/allreduce/trial-002").dir == "tune/allreduce/trial-002"
    chosen = {"allreduce": {"optim.lr": 0.15}, "local_sgd:tau=4": {"optim.lr": 0.05, "method.tau": 2}}
    full = P.full_runs(p, chosen)
    assert [(r.label, r.seed, r.config.optim.lr, getattr(r.config.method, "tau", None), r.config.train.epochs)
            for r in full] == [("allreduce", 3, 0.15, None, 5), ("local_sgd:tau=4", 3, 0.05, 2, 5),
                               ("allreduce", 4, 0.15, None, 5), ("local_sgd:tau=4", 4, 0.05, 2, 5)]
    assert [r.dir for r in full[:2]] == ["allreduce_seed-3", "local_sgd_tau-4_seed-3"]
    assert full[1].tuned == "optim.lr=0.05 method.tau=2" and len({r.key for r in full}) == 4
    untuned = P.full_runs(p, {"allreduce": {}})[0].config  # none finished: the config's own rate
    assert untuned.optim.lr == C.from_dict(p.configs["allreduce"], runconfig.method_configs()).optim.lr


def test_one_seed_keeps_plain_directory_names():
    p = plan(["allreduce", "single"])
    assert p.tune is None and [r.dir for r in P.full_runs(p, {})] == ["allreduce", "single"]
    assert [r.dir for r in P.full_runs(plan(["allreduce"], seeds=[1]), {})] == ["allreduce"]


def test_tuned_fields_must_exist_somewhere_hold_numbers_and_fit_the_field():
    assert plan(["local_sgd:tau=4"], "method.tau=2,8").tune.params[0].values == (2, 8)  # an integer field
    assert plan(["local_sgd:tau=4"], "method.tau=2:9").tune.params[0] == Param("method.tau", low=2, high=9, integer=True)
    assert plan(["allreduce"], "train.epochs=log:2:8:3").tune.params[0].values == (2, 4, 8)
    for bad, message in [("optim.nope=1", "no field 'nope'"), ("nope.lr=1", "unknown section"),
                         ("optim.schedule=1", "not a numeric field"), ("train.epochs=1.5", "not all whole"),
                         ("method.tau=2.5:4", "not all whole"), ("optim.lr=-0.1", "optim.lr"),
                         ("method.nope=1,2", "no method of this comparison has that field")]:
        with pytest.raises(ConfigError, match=bad.split("=")[0]) as e:
            plan(["allreduce", "local_sgd"], bad)
        assert message in str(e.value)
    with pytest.raises(ConfigError, match="method.tau.*no method of this comparison"):
        plan(["allreduce", "single"], "method.tau=2,8")
    with pytest.raises(ConfigError, match="method.tau"):  # checked at both ends before anything runs
        plan(["local_sgd"], "method.tau=0:8")


def test_an_older_plans_one_field_sweep_reads_as_a_grid():
    old = {"labels": ["allreduce"], "configs": {"allreduce": {"method": {"name": "allreduce"}}},
           "tune": {"field": "optim.lr", "values": [0.1, 0.2], "epochs": 2}}
    p = P.Plan.from_json(old)
    assert p.tune == Tune((Param("optim.lr", (0.1, 0.2)),), 2, sampler="grid", pruner="none")
    assert p.tuned == {"allreduce": ["optim.lr"]}


def test_plan_round_trips_and_records_finished_runs(tmp_path):
    p = plan(["allreduce", "local_sgd:tau=4"], "optim.lr=log:0.01:0.1:3", seeds=[0, 1])
    folder = ComparisonDir(str(tmp_path))
    folder.save_plan(p)
    again = folder.load_plan()
    assert again == p and P.full_runs(again, {}) == P.full_runs(p, {})
    assert folder.finished() == {} and folder.budget() == "epochs"
    folder.mark("run/allreduce/seed=0", "d", 1)
    folder.mark("run/allreduce/seed=0", "d", 0)
    assert folder.finished()["run/allreduce/seed=0"]["code"] == 0  # the last record counts
    with pytest.raises(Exception, match="no plan.json"):
        ComparisonDir(str(tmp_path / "nothing")).load_plan()


def test_suite_files_hold_per_method_settings(tmp_path):
    from lowband.comparison.request import load_suite

    path = tmp_path / "mine.toml"
    path.write_text('methods = ["allreduce", "local_sgd:tau=4", "local_sgd:tau=16"]\n[config.train]\nworkers = 2\n'
                    '[per_method.local_sgd]\noptim.lr = 0.1\n[per_method."local_sgd:tau=16"]\noptim.lr = 0.2\n')
    suite = load_suite(path=str(path))
    assert suite["per_method"] == {"local_sgd": {"optim": {"lr": 0.1}}, "local_sgd:tau=16": {"optim": {"lr": 0.2}}}
    p = P.make_plan(suite["methods"], suite["config"], {}, "F", suite={"per_method": suite["per_method"]})
    assert [raw.get("optim", {}).get("lr") for raw in p.configs.values()] == [None, 0.1, 0.2]
    path.write_text('methods = ["allreduce"]\nper_method = {local_sgd = 1}\n')
    with pytest.raises(ConfigError, match="per_method"):
        load_suite(path=str(path))


def test_budgets_scale_each_methods_epochs_to_allreduces_steps_or_samples():
    # a fake layout: (steps per epoch per worker, workers) as if 480 training samples, batch 16
    def layout(cfg):
        world = resolve(cfg).world
        shard = 480 if cfg.method.name == "single" else 480 // world * (2 if cfg.method.name == "codistill" else 1)
        return shard // cfg.train.batch_size, world

    specs = ["single", "allreduce", "local_sgd:tau=4", "codistill:group_size=2"]
    base = {"train": {"workers": 4, "epochs": 20, "batch_size": 16}}

    def epochs(budget, tune=None):
        p = P.make_plan(specs, base, {}, "F", tune=tune, budget=budget, layout=layout)
        trials = [P.trial_run(p, label, 0, {"optim.lr": 0.1}) for label in specs] if tune else []
        return [r.config.train.epochs for r in P.full_runs(p, {})], trials

    assert epochs("epochs")[0] == [20, 20, 20, 20]
    # allreduce: 7 steps x 16 x 4 = 448 samples per epoch; single: 30 steps = 480; codistill (all data twice): 15 steps
    assert epochs("steps")[0] == [round(20 * 7 / 30), 20, 20, round(20 * 7 / 15)]
    assert epochs("samples")[0] == [round(20 * 448 / 480), 20, 20, round(20 * 448 / (15 * 16 * 4))]
    tuning = epochs("steps", parse_tune("optim.lr=0.1", 10))[1]
    assert [r.config.train.epochs for r in tuning] == [2, 10, 10, 5]  # tuning runs scale alike
    with pytest.raises(ConfigError, match="--budget"):
        epochs("time")


def test_an_interrupted_preparation_continues_its_run(tmp_path):
    from lowband.comparison.runner import continued

    command = f"train --method single --epochs 10 --run-dir {tmp_path}/teacher"
    assert continued(command) == command
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.toml").write_text("")
    assert continued(command) == f"train --resume {tmp_path}/teacher"


def test_a_target_budget_runs_the_reference_first_and_caps_the_others_at_factor_times_its_samples():
    def layout(cfg):  # allreduce: 7 steps x 16 x 4 = 448 samples an epoch; single: 30 x 16 = 480
        return (30, 1) if cfg.method.name == "single" else (7, resolve(cfg).world)

    base = {"train": {"workers": 4, "epochs": 5, "batch_size": 16}}
    p = P.make_plan(["single", "local_sgd:tau=4", "allreduce"], base, {}, "F", budget="target:2", layout=layout,
                    seeds=[0, 1])
    assert (p.budget, p.factor, p.reference) == ("target", 2.0, "allreduce")
    runs = P.full_runs(p, {})
    assert [(r.label, r.seed) for r in runs[:3]] == [("allreduce", 0), ("single", 0), ("local_sgd:tau=4", 0)]
    # the reference keeps its epochs; the others up to 2 x its 5 x 448 samples, rounded up to whole epochs
    assert [r.config.train.epochs for r in runs[:3]] == [5, math.ceil(2 * 5 * 448 / 480), 10]
    aimed = P.aim(runs[1], 0.8, ACCURACY)
    assert (aimed.config.train.target_accuracy, aimed.config.train.stop_at_target) == (0.8, True)
    with pytest.raises(ConfigError, match="train.target_bpb"):  # a typed config: bpb on a classifier is refused
        P.aim(runs[1], 1.9, BITS_PER_BYTE)
    assert runs[1].config.train.stop_at_target is False  # aiming makes a new run, the plan's stays as it was
    assert P.make_plan(["allreduce"], base, {}, "F", budget="target", layout=layout).factor == 4.0  # the default


@pytest.mark.parametrize("budget, message", [
    ("target:0.5", "FACTOR must be a number in [1, 100]"), ("target:x", "FACTOR must be"), ("target:inf", "FACTOR must be"),
    ("target:1e300", "FACTOR must be a number in [1, 100]"),
    ("samples:2", "epochs, steps, samples or target"), ("time", "epochs, steps, samples or target"),
    ("target:", "FACTOR after 'target:' is empty"), ("samples:", "epochs, steps, samples or target")])
def test_bad_budgets(budget, message):
    with pytest.raises(ConfigError, match="--budget") as e:
        P.make_plan(["allreduce"], {"train": {"workers": 2}}, {}, "F", budget=budget)
    assert message in str(e.value) and budget in str(e.value)


def test_a_target_budget_needs_its_reference_in_the_comparison():
    with pytest.raises(ConfigError, match="--budget.*needs the reference method allreduce"):
        P.make_plan(["single", "local_sgd"], {"train": {"workers": 2}}, {}, "F", budget="target")
    p = P.make_plan(["single", "local_sgd"], {"train": {"workers": 2}}, {}, "F", budget="target",
                    suite={"target": "single"})  # a suite's own target is the reference
    assert p.reference == "single"


def test_a_method_whose_fields_are_all_lists_never_repeats_a_combination():
    tune = parse_tune(["optim.lr=0.002,0.004", "method.outer_lr=0.5:0.9"], trials=5)
    assert tune.sampler_name(["optim.lr"]) == "axis" and tune.trial_count(["optim.lr"]) == 2  # Allreduce: lr only
    assert tune.sampler_name(tune.fields) == "tpe" and tune.trial_count(tune.fields) == 5
    assert parse_tune(["optim.lr=1,2"], sampler="tpe", trials=9).trial_count(["optim.lr"]) == 2
