"""lowband.wrap refuses what would train nothing while bytes are still sent: an optimizer over another model's
parameters, a model without parameters; an optimizer that misses some parameters is a warning; a malformed
spec is blamed on `spec`, the argument the user gave (not a CLI flag)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import lowband
from lowband.comm import Communicator

pytestmark = pytest.mark.unit


def alone() -> Communicator:
    return Communicator(0, 1, torch.device("cpu"))


def test_an_optimizer_over_another_model_is_refused_naming_the_optimizer():
    model, other = nn.Linear(4, 1), nn.Linear(4, 1)
    with pytest.raises(lowband.ConfigError, match=r"^optimizer='SGD' is invalid: holds none of the model's"):
        lowband.wrap(model, torch.optim.SGD(other.parameters(), lr=0.1), "diloco:tau=4", comm=alone())


def test_an_optimizer_missing_some_parameters_is_a_warning_and_the_rest_train():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    with pytest.warns(UserWarning, match=r"holds 2 of the model's 4 trainable parameters; the other 2 stay"):
        sync = lowband.wrap(model, torch.optim.SGD(model[1].parameters(), lr=0.1), "allreduce", comm=alone())
    sync.close()


def test_a_full_optimizer_gives_no_warning():
    model = nn.Linear(4, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "allreduce", comm=alone()).close()


def test_a_model_without_parameters_is_one_config_error_not_stop_iteration():
    with pytest.raises(lowband.ConfigError, match=r"^model='ReLU' is invalid: has no trainable parameters"):
        lowband.wrap(nn.ReLU(), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), "allreduce", comm=alone())


@pytest.mark.parametrize("spec", ["diloco:tau", "diloco:x:y=1", "sparse:loco:tau=4"])
def test_a_malformed_spec_names_spec_not_a_cli_flag(spec):
    model = nn.Linear(4, 1)
    with pytest.raises(lowband.ConfigError) as caught:
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), spec, comm=alone())
    assert str(caught.value).startswith("spec=") and "--methods" not in str(caught.value), caught.value


def test_wrap_is_a_context_manager_that_closes_once_and_gives_its_resolved_config():
    model = nn.Linear(4, 1)
    with lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "diloco:tau=4", comm=alone()) as sync:
        assert sync.config.method.name == "diloco" and sync.config.method.tau == 4
        sync.close()  # an explicit close inside the block: the block's end does nothing more
    assert sync._closed


def test_the_methods_wrap_takes_are_those_that_say_they_work_around_the_step():
    from lowband.catalog import load_all
    from lowband.registry import METHODS

    load_all()
    around = {n for n in METHODS.names() if METHODS.get(n).around_the_step}
    assert around == {"allreduce", "local_sgd", "diloco", "sparseloco", "dpsgd", "rdpsgd", "topk"}
    model = nn.Linear(4, 1)
    with pytest.raises(lowband.ConfigError, match=r"^spec='ec_dnn' is invalid: wrap runs the methods that work"):
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "ec_dnn", comm=alone())


def test_the_lr_scheduler_applies_the_methods_rule_over_the_run():
    """DiLoCo's inner_lr_factor at its place in the run (lr_factor), on the optimizer's own rate."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with lowband.wrap(model, opt, "diloco:tau=4", comm=alone(), total_steps=10) as sync:
        sched = sync.lr_scheduler(opt)
        seen = []
        for _ in range(10):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert seen == pytest.approx([0.1 * sync.method.lr_factor(s / 10) for s in range(10)])


def test_the_methods_gradient_hook_runs_before_the_optimizer_step_and_never_after_close():
    """Allreduce's gradients must be averaged before the step uses them; after close() the hook is gone."""
    model = nn.Linear(4, 1)
    opt, order = torch.optim.SGD(model.parameters(), lr=0.1), []
    sync = lowband.wrap(model, opt, "allreduce", comm=alone())
    sync.method.after_backward = lambda step: order.append(("hook", float(model.bias.detach())))
    opt.register_step_post_hook(lambda *_: order.append(("step", float(model.bias.detach()))))
    before = float(model.bias.detach())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert [what for what, _ in order] == ["hook", "step"] and order[0][1] == before  # the hook saw no step yet
    sync.close()
    opt.step()
    assert [what for what, _ in order] == ["hook", "step", "step"]  # the hook left with close()


def test_bytes_sent_leaves_the_bookkeeping_tags_out():
    from lowband.comm import BOOKKEEPING_TAGS

    model = nn.Linear(4, 1)
    with lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "allreduce", comm=alone()) as sync:
        sync.comm.ledger.count("grad", sent=1000.0, recv=1000.0)
        for tag in sorted(BOOKKEEPING_TAGS):
            sync.comm.ledger.count(tag, sent=7.0, recv=7.0)
        assert sync.bytes_sent == 1000.0 and sync.bytes_received == 1000.0


def test_a_tune_seed_of_2_to_the_32_is_refused_naming_the_flag(tmp_path, capsys):
    from lowband.cli import main

    code = main(["compare", "--methods", "allreduce", "--tune", "optim.lr=0.1,0.2", "--tune-seed", str(2**32),
                 "--samples", "300", "--epochs", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("lowband: error: --tune-seed=4294967296 is invalid") and "\n" not in err


@pytest.mark.parametrize("keywords, field", [
    ({"elastic": "localhost:6379"}, "elastic"),  # not a URL
    ({"elastic": "redis://127.0.0.1:1/0", "workers": 0}, "workers"),
    ({"elastic": "redis://127.0.0.1:1/0", "workers": 10**6}, "workers"),
    ({"elastic": "redis://127.0.0.1:1/0", "config": {"train": {"epochs": 2}}}, "config"),
    ({"elastic": "redis://127.0.0.1:1/0", "config": {"elastic": {"dead_after_s": -1}}}, "elastic.dead_after_s"),
    ({"config": {"elastic": {"dead_after_s": 2}}}, "config"),  # the elastic table without elastic=URL
])
def test_bad_elastic_input_to_wrap_is_one_config_error_naming_the_field(keywords, field):
    model = nn.Linear(4, 1)
    with pytest.raises(lowband.ConfigError) as err:
        lowband.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), "diloco:tau=4", **keywords)
    assert str(err.value).startswith(f"{field}=") and "\n" not in str(err.value), str(err.value)


def test_an_elastic_wrap_refuses_a_method_that_cannot_run_elastic_and_an_absent_coordinator():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(lowband.ConfigError, match=r"^method.name='allreduce' is invalid"):
        lowband.wrap(model, opt, "allreduce", elastic="redis://127.0.0.1:1/0")
    with pytest.raises(lowband.UsageError, match=r"^elastic coordinator redis://127.0.0.1:1/0 is unreachable"):
        lowband.wrap(model, opt, "diloco:tau=4", elastic="redis://127.0.0.1:1/0")
