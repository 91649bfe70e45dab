"""A comparison's plan: --seeds and --tune parsing, per-method settings, the runs it implies, resume records."""

import pytest

from lowband.comparison import plan as P
from lowband.comparison.folder import ComparisonDir
from lowband.errors import ConfigError
from lowband.run.spec import resolve


def test_seeds_are_distinct_non_negative_integers():
    assert P.parse_seeds("0,1,2") == [0, 1, 2] and P.parse_seeds(" 7 ") == [7]
    for bad in ("", "a", "-1", "0,,1", "1.5", "0,0"):
        with pytest.raises(ConfigError, match="--seeds"):
            P.parse_seeds(bad)


def test_tune_lists_and_log_spacing():
    assert P.parse_tune("optim.lr=0.025,0.05,0.1") == P.Tune("optim.lr", (0.025, 0.05, 0.1))
    assert P.parse_tune("optim.lr=0.1,0.1,0.2", 3) == P.Tune("optim.lr", (0.1, 0.2), 3)
    assert P.parse_tune("optim.lr=log:0.01:1:3").values == pytest.approx((0.01, 0.1, 1.0))
    assert P.parse_tune("optim.lr=log:0.01:0.1:3").values == (0.01, 0.03162, 0.1)  # 10^-1.5, 4 digits


@pytest.mark.parametrize("bad", ["optim.lr", "optim.lr=", "lr=0.1", "optim.lr=a,0.1", "optim.lr=0.1,nan",
                                 "optim.lr=log:0:1:3", "optim.lr=log:-1:1:3", "optim.lr=log:0.2:0.1:3",
                                 "optim.lr=log:0.1:1", "optim.lr=log:0.1:1:1", "optim.lr=log:0.1:1:x"])
def test_bad_tune_specs(bad):
    with pytest.raises(ConfigError, match="--tune"):
        P.parse_tune(bad)
    with pytest.raises(ConfigError, match="--tune-epochs"):
        P.parse_tune("optim.lr=0.1", 0)


def plan(specs, tune=None, seeds=None, base=None, overrides=None, per_method=None):
    base = base if base is not None else {"train": {"workers": 2, "epochs": 5}}
    return P.make_plan(specs, base, overrides or {}, "F", seeds=seeds, tune=P.parse_tune(tune, 2) if tune else None,
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


def test_tuning_runs_every_method_at_every_value_then_each_seed_once():
    p = plan(["allreduce", "local_sgd:tau=4"], "optim.lr=0.05,0.1", seeds=[3, 4])
    tuning = P.tuning_runs(p)
    assert [(r.label, r.value) for r in tuning] == [("allreduce", 0.05), ("allreduce", 0.1),
                                                   ("local_sgd:tau=4", 0.05), ("local_sgd:tau=4", 0.1)]
    assert {(r.config["train"]["epochs"], r.config["train"]["seed"]) for r in tuning} == {(2, 3)}
    assert [r.config["optim"]["lr"] for r in tuning] == [0.05, 0.1, 0.05, 0.1]
    assert tuning[2].dir == "tune/local_sgd_tau-4_optim.lr-0.05"
    results = [(tuning[0], 0.8), (tuning[1], 0.9), (tuning[2], 0.7), (tuning[3], 0.7)]
    chosen = P.choose(results)
    assert chosen == {"allreduce": 0.1, "local_sgd:tau=4": 0.05}  # a tie keeps the first value tried
    full = P.full_runs(p, chosen)
    assert [(r.label, r.seed, r.config["optim"]["lr"], r.config["train"]["epochs"]) for r in full] == [
        ("allreduce", 3, 0.1, 5), ("local_sgd:tau=4", 3, 0.05, 5), ("allreduce", 4, 0.1, 5), ("local_sgd:tau=4", 4, 0.05, 5)]
    assert [r.dir for r in full[:2]] == ["allreduce_seed-3", "local_sgd_tau-4_seed-3"]
    assert len({r.key for r in tuning + full}) == 8
    assert P.choose([(tuning[0], None), (tuning[1], None)]) == {"allreduce": None}  # none finished: untuned


def test_one_seed_keeps_plain_directory_names_and_no_tuning_no_tuning_runs():
    p = plan(["allreduce", "single"])
    assert P.tuning_runs(p) == [] and [r.dir for r in P.full_runs(p, {})] == ["allreduce", "single"]
    assert [r.dir for r in P.full_runs(plan(["allreduce"], seeds=[1]), {})] == ["allreduce"]


def test_tuned_fields_must_exist_hold_numbers_and_fit_the_field():
    assert plan(["local_sgd:tau=4"], "method.tau=2,8").tune.values == (2, 8)  # an integer field
    assert plan(["allreduce"], "train.epochs=log:2:8:3").tune.values == (2, 4, 8)
    for bad, message in [("optim.nope=1", "no field 'nope'"), ("nope.lr=1", "unknown section"),
                         ("optim.schedule=1", "not a numeric field"), ("train.epochs=1.5", "not all whole"),
                         ("method.tau=2", "method allreduce has no field 'tau'"), ("optim.lr=-0.1", "optim.lr")]:
        with pytest.raises(ConfigError, match=bad.split("=")[0]) as e:
            plan(["allreduce", "local_sgd"], bad)
        assert message in str(e.value)


def test_plan_round_trips_and_records_finished_runs(tmp_path):
    p = plan(["allreduce", "local_sgd:tau=4"], "optim.lr=log:0.01:0.1:3", seeds=[0, 1])
    folder = ComparisonDir(str(tmp_path))
    folder.save_plan(p)
    again = folder.load_plan()
    assert again == p and P.tuning_runs(again) == P.tuning_runs(p)
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
        return [r.config["train"]["epochs"] for r in P.full_runs(p, {})], P.tuning_runs(p)

    assert epochs("epochs")[0] == [20, 20, 20, 20]
    # allreduce: 7 steps x 16 x 4 = 448 samples per epoch; single: 30 steps = 480; codistill (all data twice): 15 steps
    assert epochs("steps")[0] == [round(20 * 7 / 30), 20, 20, round(20 * 7 / 15)]
    assert epochs("samples")[0] == [round(20 * 448 / 480), 20, 20, round(20 * 448 / (15 * 16 * 4))]
    tuning = epochs("steps", P.Tune("optim.lr", (0.1,), 10))[1]
    assert [r.config["train"]["epochs"] for r in tuning] == [2, 10, 10, 5]  # tuning runs scale alike
    with pytest.raises(ConfigError, match="--budget"):
        epochs("time")


def test_an_interrupted_preparation_continues_its_run(tmp_path):
    from lowband.comparison.runner import continued

    command = f"train --method single --epochs 10 --run-dir {tmp_path}/teacher"
    assert continued(command) == command
    (tmp_path / "teacher").mkdir()
    (tmp_path / "teacher" / "config.toml").write_text("")
    assert continued(command) == f"train --resume {tmp_path}/teacher"
