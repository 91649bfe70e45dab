"""Method specs and the EC-DNN paper's speed, from hand-made records."""

import pytest

from lowband.compare import add_speed, format_table, parse_spec, time_to
from lowband.errors import ConfigError


def test_specs_carry_method_options():
    assert parse_spec("allreduce") == ("allreduce", {})
    assert parse_spec("ec_dnn:ensemble=margin:tau=128") == ("ec_dnn", {"ensemble": "margin", "tau": 128})
    with pytest.raises(ConfigError):
        parse_spec("ec_dnn:tau")


def rec(train_s, acc, acc_l=None):
    return {"time": {"train_s": train_s}, "test_acc": acc, "test_acc_L": acc if acc_l is None else acc_l}


def row(method, records, label=None):
    return {"label": label or method, "method": method, "workers": 4, "final_acc": records[-1]["test_acc"],
            "final_acc_L": records[-1]["test_acc_L"], "best_acc": None, "epochs": len(records),
            "bytes_sent_per_worker": 0.0, "train_s": records[-1]["time"]["train_s"], "speed_G": None,
            "speed_L": None, "status": "ok", "_records": records}


def test_speed_is_ma_time_to_its_final_accuracy_over_the_methods_time():
    ma = row("local_sgd", [rec(10, 0.5), rec(20, 0.8), rec(30, 0.9)])
    fast = row("ec_dnn", [rec(5, 0.7, 0.6), rec(15, 0.95, 0.85), rec(25, 0.96, 0.91)])
    never = row("ensemble", [rec(10, 0.3), rec(20, 0.89)])
    add_speed([ma, fast, never])
    assert ma["speed_G"] == 1.0
    assert fast["speed_G"] == pytest.approx(30 / 15) and fast["speed_L"] == pytest.approx(30 / 25)
    assert never["speed_G"] == 0.0 and never["speed_L"] == 0.0
    assert time_to(fast["_records"], "test_acc", 0.99) is None
    assert "speed G" in format_table([ma, fast, never])


def test_no_speed_columns_without_ma_dnn():
    rows = [row("allreduce", [rec(1, 0.5)])]
    add_speed(rows)
    assert rows[0]["speed_G"] is None and "speed" not in format_table(rows)


def test_suites_may_prepare_and_refer_to_their_folder(tmp_path):
    from lowband.compare import fill, load_suite

    edl = load_suite("edl")
    assert edl["prepare"][0].startswith("train --method single") and "{folder}/teacher" in edl["prepare"][0]
    assert edl["method_defaults"]["edl"]["teacher"] == "{folder}/teacher"
    assert fill({"a": ["{folder}/x", 1], "b": {"c": "{folder}"}}, "F") == {"a": ["F/x", 1], "b": {"c": "F"}}
    bad = tmp_path / "bad.toml"
    bad.write_text('methods = ["single"]\nprepare = "train"\n')
    with pytest.raises(ConfigError, match="prepare"):
        load_suite(path=str(bad))
