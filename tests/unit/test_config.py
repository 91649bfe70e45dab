"""Config building, overrides and validation messages."""

from __future__ import annotations

import pytest

from lowband import config as C
from lowband.errors import ConfigError, UsageError
from lowband.training.runconfig import method_configs


def build(raw: dict) -> C.Config:
    return C.from_dict(raw, method_configs())


def test_defaults_build_and_round_trip_through_toml():
    import tomllib

    cfg = build({"method": {"name": "allreduce"}, "train": {"epochs": 3}})
    again = build(tomllib.loads(C.to_toml(cfg)))
    assert again == cfg and again.train.epochs == 3


@pytest.mark.parametrize("raw, field, fragment", [
    ({"train": {"workers": 0}}, "train.workers", "must be in 1..1024"),
    ({"optim": {"lr": 0.0}}, "optim.lr", "(0, 1000]"),
    ({"optim": {"lr": -1}}, "optim.lr", "(0, 1000]"),
    ({"train": {"epochs": "ten"}}, "train.epochs", "integer"),
    ({"train": {"workers": True}}, "train.workers", "integer"),
    ({"data": {"partition": "random"}}, "data.partition", "'iid', 'dirichlet', 'same'"),
    ({"train": {"wrokers": 4}}, "train.wrokers", "known keys: workers"),
    ({"trian": {}}, "trian", "known: method"),
    ({"method": {"name": "nope"}}, "method.name", "known methods: "),
    ({"method": {"name": "single", "warmup_epochs": 1}}, "method.warmup_epochs", "known keys: name"),
    ({"optim": {"milestones": [20, 10]}}, "optim.milestones", "increasing"),
    ({"optim": {"warmup_epochs": "soon"}}, "optim.warmup_epochs", "'auto'"),
    # declared forms: a pattern, a grammar of its own, a list's items, a field that applies with another's value
    ({"train": {"loggers": ["tensorbord"]}}, "train.loggers", "'tensorbord' is invalid: must be tensorboard, wandb"),
    ({"elastic": {"coordinator": "http://h:1"}}, "elastic.coordinator", "redis://, rediss:// or unix://"),
    ({"link": {"rate": "fast"}}, "link.rate", "RATE[,LATENCY] such as 10mbit,20ms"),
    ({"link": {"site_of": [0, -1]}}, "link.site_of", "=-1 is invalid: must be >= 0"),
    ({"link": {"site_of": [0, 1.5]}}, "link.site_of", "=1.5 is invalid: must be an integer"),
    ({"optim": {"milestones": [0, 10]}}, "optim.milestones", "=0.0 is invalid: must be > 0"),
    ({"method": {"name": "sparseloco", "codec": "topk:0.1"}}, "method.codec", "(the top-k is method.density)"),
    ({"method": {"name": "sparseloco", "flush": "topk:0.1"}}, "method.flush", "'' (no flush) or a dense codec"),
    ({"method": {"name": "diloco", "codec": "topk:2"}}, "method.codec", "topk:F needs 0 < F <= 1"),
    ({"method": {"name": "codistill", "answer_topk": 5}}, "method.answer_topk",
     "applies with method.exchange='server' only, not 'store'"),
])
def test_invalid_values_name_field_value_and_what_is_allowed(raw, field, fragment):
    with pytest.raises(ConfigError) as e:
        build(raw)
    assert e.value.field == field
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_ints_are_accepted_for_floats_and_kept_as_float():
    cfg = build({"optim": {"lr": 1}})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)


@pytest.mark.parametrize("item, path, value", [
    ("train.epochs=10", ["train", "epochs"], 10),
    ("optim.lr=0.1", ["optim", "lr"], 0.1),
    ("data.name=digits", ["data", "name"], "digits"),
    ('data.root="/a b"', ["data", "root"], "/a b"),
    ("optim.milestones=[10, 20]", ["optim", "milestones"], [10, 20]),
    ("optim.nesterov=true", ["optim", "nesterov"], True),
])
def test_set_values_are_parsed_as_toml(item, path, value):
    assert C.parse_set(item) == (path, value)


@pytest.mark.parametrize("item", ["epochs=3", "train.epochs", "=3", "train..x=1"])
def test_malformed_set_is_a_config_error(item):
    with pytest.raises(ConfigError, match="SECTION.KEY=VALUE"):
        C.parse_set(item)


def test_merge_is_deep_and_does_not_mutate():
    base = {"train": {"epochs": 1, "seed": 2}}
    out = C.merge(base, {"train": {"epochs": 5}})
    assert out == {"train": {"epochs": 5, "seed": 2}} and base["train"]["epochs"] == 1


def test_bad_toml_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text("[train\nepochs = 1")
    with pytest.raises(UsageError, match="not valid TOML"):
        C.read_toml(str(bad))
    with pytest.raises(UsageError, match="file not found"):
        C.read_toml(str(tmp_path / "missing.toml"))


def test_describe_lists_every_field_with_its_help():
    text = C.describe(build({}))
    for section in ("[method]", "[train]", "[data]", "[model]", "[optim]"):
        assert section in text
    assert "workers = 4" in text and "worker processes K" in text


def test_an_unknown_method_lists_every_registered_method():
    from lowband.registry import METHODS

    with pytest.raises(ConfigError) as e:
        build({"method": {"name": "nope"}})
    assert all(name in str(e.value) for name in METHODS.names()) and len(METHODS.names()) >= 9


def test_text_data_is_decided_in_one_place():
    assert C.is_text_data("text") and C.is_text_data("text:/data/a:b") and not C.is_text_data("textures")
    assert C.text_path("text") is None and C.text_path("text:~/corpus") == "~/corpus" and C.text_path("text:") == ""
    assert C.DataConfig(name="text:x", partition="iid").is_text and not C.DataConfig(name="mnist1d").is_text


@pytest.mark.parametrize("model, data, want", [(64, None, (64, 64)), (256, None, (256, 256)), (0, 32, (0, 32)),
                                               (64, 32, (64, 32)), (None, None, (0, 128))])
def test_one_context_is_enough(model, data, want):
    """model.context alone sets the data's window too; data.context alone is taken by the model (0)."""
    raw = {"method": {"name": "single"}, "model": {"name": "gpt"}, "data": {"name": "text"}}
    if model is not None:
        raw["model"]["context"] = model
    if data is not None:
        raw["data"]["context"] = data
    cfg = build(raw)
    assert (cfg.model.context, cfg.data.context) == want


#: the sizes bounded by the run rather than by their declaration, each with the check that bounds it
BOUNDED_AT_RUN = {
    "train.batch_size": "partition.steps_per_epoch: at most the smallest worker's shard",
    "data.context": "the text's loader: at most a split of the corpus",
    "data.max_bytes": "reads at most the corpus",
    "link.sites": "net.sites.site_map: at most the workers",
    "link.site_of": "net.sites.site_map: each rank's site below the workers",
    "method.group_size": "the method's check: it divides the workers",
    "method.chunk": "SparseLoCo.check_model: at most the model's parameters",
    "method.fragments": "DiLoCo: at most tau and the model's parameter tensors",
    "method.overlap": "DiLoCo: below tau / fragments",
    "method.answer_topk": "codistillation: k >= the classes sends all",
    # a count of steps: one past the run's steps never comes (tau: the workers meet once, at the end)
    "method.tau": "steps", "method.interval": "steps", "method.burn_in": "steps", "method.sync_every": "steps",
}


def test_every_size_a_user_gives_is_bounded():
    """Every whole-number field (a count of processes, threads, layers, samples, epochs...) and every time in
    seconds declares a finite largest value where it is defined, unless the run bounds it (BOUNDED_AT_RUN)."""
    import dataclasses
    import math

    tables = [("train", C.TrainConfig), ("data", C.DataConfig), ("model", C.ModelConfig), ("optim", C.OptimConfig),
              ("link", C.LinkConfig), ("elastic", C.ElasticConfig)]
    tables += [("method", cls) for cls in method_configs().values()]
    from lowband.comparison.space import Tune
    from lowband.wrapping import WrapArgs

    tables += [("wrap", WrapArgs), ("tune", Tune)]
    open_ended = set()
    for section, cls in tables:
        rules, ints = C.bounds_of(cls), C._integers(cls)
        for f in dataclasses.fields(cls):
            name = f"{section}.{f.name}"
            if not (f.name in ints or f.name.endswith("_s")) or name in BOUNDED_AT_RUN:
                continue
            rule = rules.get(f.name)
            if not isinstance(rule, C.Bounds) or rule._interval()[1] == math.inf:
                open_ended.add(name)
    assert not open_ended, f"no largest value declared: {sorted(open_ended)}"


def test_threads_past_the_cores_are_refused_naming_the_cores(monkeypatch):
    monkeypatch.setattr(C, "machine_cores", lambda: 2)
    C.check_threads(2, "train.threads")
    with pytest.raises(ConfigError, match=r"train.threads=3 is invalid: must be <= 2, this machine's cores"):
        C.check_threads(3, "train.threads")
