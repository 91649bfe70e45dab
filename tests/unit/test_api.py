"""The Python API's settings: the same layering and validation as the command line, raised as lowband errors."""

import importlib

import pytest

import lowband
from lowband import api


def test_keywords_shortcuts_and_dotted_keys_layer_over_a_config():
    cfg = api.build_config({"train": {"epochs": 7, "workers": 3}}, "local_sgd",
                      {"workers": 2, "method.tau": 4, "optim.lr": 0.2, "dataset": "digits"})
    assert (cfg.method.name, cfg.method.tau, cfg.train.workers, cfg.train.epochs) == ("local_sgd", 4, 2, 7)
    assert cfg.optim.lr == 0.2 and cfg.data.name == "digits"
    assert api.build_config(cfg).train.workers == 2  # a Config round-trips


def test_a_toml_path_is_read(tmp_path):
    path = tmp_path / "my.toml"
    path.write_text("[method]\nname = 'ec_dnn'\nensemble = 'margin'\n[train]\nepochs = 5\n")
    cfg = api.build_config(str(path), overrides={"epochs": 6})
    assert (cfg.method.name, cfg.method.ensemble, cfg.train.epochs) == ("ec_dnn", "margin", 6)


@pytest.mark.parametrize("method, overrides, fragment", [
    ("local_sgd", {"workers": 0}, "train.workers=0 is invalid"),
    ("allreduce", {"method.tau": 4}, "method.tau=4 is invalid: unknown key"),
    ("nope", {}, "method.name='nope' is invalid"),
    ("allreduce", {"width": 3}, "unknown keyword"),
])
def test_bad_settings_raise_a_lowband_error_not_system_exit(method, overrides, fragment):
    with pytest.raises(lowband.LowbandError, match=fragment):
        lowband.train(method=method, **overrides)


def test_compare_needs_a_list():
    with pytest.raises(lowband.ConfigError, match="methods"):
        lowband.compare("allreduce")


def test_the_api_is_loaded_on_first_use():
    assert lowband.train is api.train and lowband.load_model is api.load_model
    importlib.import_module("lowband.comparison.runner")  # importing the comparison's code changes nothing
    assert lowband.compare is api.compare and callable(lowband.compare)

    with pytest.raises(lowband.ConfigError, match="methods"):
        lowband.compare([])
    with pytest.raises(AttributeError):
        lowband.nothing_here  # noqa: B018


@pytest.mark.parametrize("kwargs, field", [
    ({"tune": "optim.lr=0.1"}, "tune"), ({"tune": ["optim.lr=oops"]}, "--tune"), ({"seeds": [0, 0]}, "--seeds"),
    ({"tune": ["optim.lr=0.1,0.2"], "tune_pruner": "hyper"}, "--tune-pruner"), ({"budget": "moon"}, "--budget"),
    ({"tune_on": 0}, "tune_on"), ({"tune": ["optim.lr=0.1,0.2"], "tune_on": -1}, "--tune-on"),
])
def test_compare_takes_the_commands_tuning_seeds_and_budget_and_checks_them_first(tmp_path, kwargs, field):
    with pytest.raises(lowband.ConfigError, match=f"^{field}="):
        lowband.compare(["single", "allreduce"], workers=2, epochs=1, out=str(tmp_path), **kwargs)
    assert not any(tmp_path.iterdir())  # refused before any folder exists
