"""Method specs and the console table (lowband.comparison.table's) from hand-made records."""

import re

import pytest

from lowband.comparison.runner import add_speed, format_table, parse_spec, time_to
from lowband.comparison.summary import SummaryRow
from lowband.errors import ConfigError
from lowband.records import EpochRecord


def test_specs_carry_method_options():
    assert parse_spec("allreduce") == ("allreduce", {})
    assert parse_spec("ec_dnn:ensemble=margin:tau=128") == ("ec_dnn", {"ensemble": "margin", "tau": 128})
    with pytest.raises(ConfigError):
        parse_spec("ec_dnn:tau")


def test_option_values_may_hold_colons():
    assert parse_spec("diloco:codec=topk:0.02+int2:tau=64") == ("diloco", {"codec": "topk:0.02+int2", "tau": 64})
    assert parse_spec("local_sgd:tau=16:codec=int4:stochastic") == ("local_sgd", {"tau": 16, "codec": "int4:stochastic"})


def rec(epoch, train_s, val, sent=0.0):
    return EpochRecord(epoch=epoch, time={"train_s": train_s}, val_acc=val, test_acc=val,
                       bytes_sent_per_worker=sent, samples=100 * epoch)


def row(method, records, label=None):
    return SummaryRow(label=label or method, method=method, workers=4, records=records)


def test_compare_prints_the_shared_table_with_one_reference():
    ar = row("allreduce", [rec(1, 10, 0.5, 1e6), rec(2, 20, 0.8, 2e6), rec(3, 30, 0.9, 3e6)])
    ma = row("local_sgd", [rec(1, 5, 0.7, 1e4), rec(2, 10, 0.95, 2e4)], "local_sgd:tau=16")
    never = row("ensemble", [rec(1, 10, 0.3), rec(2, 20, 0.89)])
    add_speed([ar, ma, never])
    assert ar.speedup == 1.0 and ma.speedup == pytest.approx(30 / 10) and never.speedup is None
    text = format_table([ar, ma, never])
    assert "Target accuracy (validation): 0.9000 (mean final validation accuracy of allreduce)" in text
    lines = {line.split()[0]: line for line in text.splitlines()[2:5]}
    assert "3.00x" in lines["local_sgd:tau=16"] and "never" in lines["ensemble"] and "0 B" in lines["ensemble"]
    assert time_to(ma.records, "val_acc", 0.99) is None and time_to(ma.records, "val_acc", 0.9) == 10


def test_a_given_target_and_no_allreduce():
    ma = row("local_sgd", [rec(1, 5, 0.7), rec(2, 10, 0.95)])
    add_speed([ma], target=0.9)
    assert ma.speedup is None
    assert "Target accuracy (validation): 0.9000 (given)" in format_table([ma], target=0.9)
    assert "none (no reference run and no target given)" in format_table([ma])


def test_suites_may_prepare_and_refer_to_their_folder(tmp_path):
    from lowband.comparison.plan import fill
    from lowband.comparison.request import load_suite

    edl = load_suite("edl")
    assert edl["prepare"][0].startswith("train --method single") and "{folder}/teacher" in edl["prepare"][0]
    assert edl["method_defaults"]["edl"]["teacher"] == "{folder}/teacher"
    assert fill({"a": ["{folder}/x", 1], "b": {"c": "{folder}"}}, "F") == {"a": ["F/x", 1], "b": {"c": "F"}}
    bad = tmp_path / "bad.toml"
    bad.write_text('methods = ["single"]\nprepare = "train"\n')
    with pytest.raises(ConfigError, match="prepare"):
        load_suite(path=str(bad))


@pytest.mark.parametrize("name", ["quick", "demo", "lm", "afsd", "ecdnn", "edl", "rdpsgd", "sites"])
def test_every_built_in_suite_plans_with_every_runs_config_checked(tmp_path, name):
    from lowband.comparison.request import Request, load_suite, plan_for, suite_names

    assert name in suite_names()
    plan, folder = plan_for(Request(suite=name, out=str(tmp_path)))  # a bad spec or option raises here
    assert plan.labels == load_suite(name)["methods"] and folder.startswith(str(tmp_path))


def test_a_suites_budget_is_used_unless_the_command_line_gives_one(tmp_path):
    from lowband.comparison.request import Request, load_suite, plan_for

    suite = tmp_path / "s.toml"
    suite.write_text('methods = ["allreduce", "local_sgd"]\nbudget = "target:2"\n[config.train]\nworkers = 2\n'
                     '[config.data]\nname = "mnist1d"\nnum_samples = 400\n')
    plan, _ = plan_for(Request(suite_file=str(suite), out=str(tmp_path)))
    assert (plan.budget, plan.factor, plan.reference) == ("target", 2.0, "allreduce")
    plan, _ = plan_for(Request(suite_file=str(suite), budget="epochs", out=str(tmp_path)))
    assert (plan.budget, plan.reference) == ("epochs", "allreduce")  # the reference of every budget
    plan, _ = plan_for(Request(suite_file=str(suite), methods=["local_sgd"], budget="epochs", out=str(tmp_path)))
    assert plan.reference is None  # no Allreduce here: no reference, and no target budget to need one
    suite.write_text('methods = ["allreduce", "single"]\ntarget = "single"\n')
    assert plan_for(Request(suite_file=str(suite), out=str(tmp_path)))[0].reference == "single"
    with pytest.raises(ConfigError, match="^target='single' is invalid: .*not in this comparison"):
        plan_for(Request(suite_file=str(suite), methods=["allreduce"], budget="target", out=str(tmp_path)))
    suite.write_text('methods = ["allreduce", "single"]\ntarget = "nosuch"\n')
    with pytest.raises(ConfigError, match="^target='nosuch' is invalid: .*one of its methods: allreduce, single"):
        load_suite(path=str(suite))
    assert load_suite("quick")["budget"] == "epochs"  # no budget key: the default
    for bad, allowed in (('"target:0.5"', "FACTOR must be a number in [1, 100]"),
                         ("3", "epochs, steps, samples or target")):
        suite.write_text(f'methods = ["allreduce"]\nbudget = {bad}\n')
        with pytest.raises(ConfigError, match=f"^budget=.* is invalid: .*{re.escape(allowed)}"):
            load_suite(path=str(suite))


@pytest.mark.parametrize("name", ["quick", "lm", "edl", "sites"])
def test_a_suites_teacher_is_trained_on_the_windows_its_students_read(tmp_path, name):
    """A teacher prepared on other windows than the students' (a context of 128 for students of 64) is
    skipped by every student as 'serves inputs [128], needs [64]': EDL then waits for a teacher in vain."""
    import shlex

    from lowband import cli
    from lowband import config as C
    from lowband.comparison.request import Request, plan_for
    from lowband.training.runconfig import method_configs

    plan, _ = plan_for(Request(suite=name, out=str(tmp_path)))
    teacher = cli.config_from_args(cli.parser().parse_args(shlex.split(plan.prepare[0])))
    for label, raw in plan.configs.items():
        student = C.from_dict(raw, method_configs())
        assert (teacher.data.name, teacher.data.context) == (student.data.name, student.data.context), label


def test_a_suites_preparation_runs_for_the_picked_methods_that_read_what_it_writes(tmp_path):
    """`--suite lm --methods edl` trains the teacher EDL reads from the folder; `--methods allreduce` does not."""
    from lowband.comparison.request import Request, plan_for

    for methods, prepared in ((["allreduce", "edl"], True), (["edl"], True), (["allreduce", "dpsgd"], False), (None, True)):
        plan, _ = plan_for(Request(suite="lm", methods=methods, out=str(tmp_path)))
        assert bool(plan.prepare) == prepared, methods
