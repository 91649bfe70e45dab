"""Learning-rate schedule against hand-computed values."""

import math

import pytest

from lowband.config import OptimConfig
from lowband.run.schedule import lr_at


def test_goyal_warmup_ramps_from_one_worker_rate_to_scaled_rate():
    cfg = OptimConfig(lr=0.1, schedule="constant")
    assert lr_at(0.0, cfg, 30, scale=4, warmup=2) == pytest.approx(0.1)
    assert lr_at(1.0, cfg, 30, scale=4, warmup=2) == pytest.approx(0.25)
    assert lr_at(2.0, cfg, 30, scale=4, warmup=2) == pytest.approx(0.4)
    assert lr_at(2.0, OptimConfig(lr=0.1, schedule="constant", lr_scaling="none"), 30, 4, 0) == pytest.approx(0.1)


def test_warmup_without_scaling_starts_from_zero():
    cfg = OptimConfig(lr=0.2, schedule="constant")
    assert lr_at(0.5, cfg, 10, scale=1, warmup=1) == pytest.approx(0.1)


def test_step_schedule_multiplies_by_gamma_at_each_milestone():
    cfg = OptimConfig(lr=1.0, schedule="step", milestones=[45, 55], gamma=0.1)
    assert [lr_at(e, cfg, 60, 1, 0) for e in (44.9, 45, 54.9, 55)] == pytest.approx([1, 0.1, 0.1, 0.01])


def test_cosine_decays_from_peak_to_zero_after_warmup():
    cfg = OptimConfig(lr=0.1, schedule="cosine")
    assert lr_at(2, cfg, 12, scale=2, warmup=2) == pytest.approx(0.2)
    assert lr_at(7, cfg, 12, scale=2, warmup=2) == pytest.approx(0.1)
    assert lr_at(12, cfg, 12, scale=2, warmup=2) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(4.5, cfg, 12, 2, 2) == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 0.25)))


def test_a_tau_schedule_grows_tau_at_its_fractions_and_refuses_what_does_not():
    from lowband.errors import ConfigError
    from lowband.methods.outer import TauSchedule

    s = TauSchedule("16@0.1/32@0.5", 4)
    assert [s.at(f) for f in (0.0, 0.099, 0.1, 0.49, 0.5, 1.0)] == [4, 4, 16, 16, 32, 32]
    assert TauSchedule("", 8).at(0.9) == 8
    for bad in ("16", "4@0.1", "16@0.5/8@0.6", "16@0.5/32@0.4", "16@1", "16@0", "x@0.1", "16@0.1/"):
        with pytest.raises(ConfigError, match="method.tau_schedule"):
            TauSchedule(bad, 4)


def test_the_inner_lr_factor_scales_every_rate_of_the_schedule():
    """DiLoCo's method.inner_lr_factor multiplies the rate at every point of the schedule (warm-up included)."""
    from lowband.config import Config, OptimConfig, TrainConfig
    from lowband.methods.diloco import DiLoCo, DiLoCoConfig
    from lowband.run.schedule import MethodSchedule

    def schedule(factor: float) -> MethodSchedule:
        cfg = Config(method=DiLoCoConfig(inner_lr_factor=factor), train=TrainConfig(epochs=4),
                     optim=OptimConfig(lr=0.1, warmup_epochs=0.5, schedule="cosine"))
        method = DiLoCo.__new__(DiLoCo)
        method.cfg = cfg.method
        return MethodSchedule(cfg, method)

    full, half = schedule(1.0), schedule(0.5)
    for epoch in (0.1, 0.5, 1.0, 2.5, 3.9):
        assert half.at(epoch) == pytest.approx(0.5 * full.at(epoch)) and full.at(epoch) > 0


def test_the_inner_lr_factor_moves_linearly_to_its_end_over_the_run():
    """method.inner_lr_factor_end: the factor goes from inner_lr_factor at step 0 to the end value at the last
    step, linearly in the steps taken, and multiplies the schedule's rate there; bad ends are refused."""
    from types import SimpleNamespace

    from lowband.config import Config, OptimConfig, TrainConfig
    from lowband.errors import ConfigError
    from lowband.methods.diloco import DiLoCo, DiLoCoConfig
    from lowband.run.schedule import MethodSchedule

    cfg = Config(method=DiLoCoConfig(inner_lr_factor=0.5, inner_lr_factor_end=1.0), train=TrainConfig(epochs=4),
                 optim=OptimConfig(lr=0.1, warmup_epochs=0, schedule="constant"))
    method = DiLoCo.__new__(DiLoCo)
    method.cfg, method.ctx = cfg.method, SimpleNamespace(total_steps=200)
    schedule = MethodSchedule(cfg, method)
    for epoch, factor in ((0, 0.5), (1, 0.625), (2, 0.75), (4, 1.0)):  # a pure function of the place
        assert method.lr_factor(epoch / 4) == pytest.approx(factor)
        assert schedule.at(epoch) == pytest.approx(0.1 * factor)
    for bad in (0.0, -2.0, math.inf, 101.0):
        with pytest.raises(ConfigError, match="method.inner_lr_factor_end"):
            DiLoCoConfig(inner_lr_factor_end=bad)
