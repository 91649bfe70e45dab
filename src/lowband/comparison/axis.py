"""The axis search: lowband's default sampler over a small discrete space (every `--tune` field a list).

It changes one field at a time, as a person tuning by hand would (a compass search on the grid):

1. the first trial runs the middle value of every list (the upper middle of an even list);
2. the next ones poll it: every setting one field away from the middle;
3. then the search moves to the best setting that completed so far (never a pruned or failed one)
   and runs its one-field changes not yet run, field by field in `--tune` order; it moves again as
   soon as one of them completes better;
4. it ends when every one-field change of the best setting has run (the best is a local optimum
   along every field). A `--tune-trials` beyond that runs the other settings in a seeded random order.

The first poll costs `1 + sum(len(values) - 1)` trials (6 for 4 x 3 values, 5 for 3 x 2 x 2), where
the grid costs their product (12). The search finds the grid's best when that best can be reached by
changing one field at a time, each change an improvement; the comparison's report says how much of the
space was tried, and whether the chosen setting's one-field changes were all run
(lowband.comparison.coverage). The sampler is deterministic but for step 4's random order: the same
results give the same trials whatever the seed, and a resumed search goes on where it stopped (it reads
everything from the study). benchmarks/history/JOURNAL.md ("Tuning defaults") measures it against the grid, TPE, a
Gaussian process and pruned variants on three spaces.
"""

from __future__ import annotations

import random

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

Point = tuple


class AxisSampler(BaseSampler):
    """Optuna sampler for the axis search over `space` ({field: [values]}, in `--tune` order)."""

    def __init__(self, space: dict[str, list], seed: int = 0):
        self.space = {field: list(values) for field, values in space.items()}
        self.seed = seed

    # Optuna's relative sampling: the whole setting is picked once per trial, before its first suggestion
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {field: CategoricalDistribution(values) for field, values in self.space.items()}

    def sample_relative(self, study: Study, trial: FrozenTrial, search_space: dict) -> dict:
        if not search_space:
            return {}
        others = [t for t in study.trials if t.number != trial.number]
        return self.next_setting(others, study.direction.name == "MAXIMIZE")

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution):
        """A field outside the space (none in lowband's use): the middle value, or the distribution's first."""
        if param_name in self.space:
            return self.setting(self.middle())[param_name]
        return param_distribution.to_external_repr(0)  # type: ignore[attr-defined]

    def next_setting(self, trials: list[FrozenTrial], maximize: bool) -> dict:
        """The next setting to run given the study's trials (see the module's steps)."""
        point = self.poll(trials, maximize)
        if point is not None:
            return self.setting(point)
        run = self.run(trials)
        rest = [p for p in self.all_points() if p not in run]
        rng = random.Random(f"{self.seed}:{len(run)}")
        return self.setting(rng.choice(rest) if rest else self.middle())

    def converged(self, trials: list[FrozenTrial], maximize: bool) -> bool:
        """Whether every one-field change of the best complete setting has run (the search's own end)."""
        return self.poll(trials, maximize) is None

    def poll(self, trials: list[FrozenTrial], maximize: bool) -> Point | None:
        """The next setting of the search (steps 1 and 2), or None once it is at a local optimum."""
        run = self.run(trials)
        center, best = self.middle(), self.best(trials, maximize)
        while True:
            if center not in run:
                return center
            untried = [p for p in self.neighbours(center) if p not in run]
            if untried:
                return untried[0]
            extra = self.after_poll(center, trials, maximize)
            if extra is not None and extra not in run:
                return extra
            if best is None or best == center:
                return None
            center = best

    def after_poll(self, center: Point, trials: list[FrozenTrial], maximize: bool) -> Point | None:
        """A setting to run once every one-field change of `center` has run, before moving on (None: none).
        The axis search has none; a variant may (benchmarks/tuning_defaults.py replays a pattern move)."""
        return None

    def run(self, trials: list[FrozenTrial]) -> set[Point]:
        """The settings of every trial so far (finished, running or being asked)."""
        return {self.point(t.params) for t in trials if t.params and self.covers(t.params)}

    def best(self, trials: list[FrozenTrial], maximize: bool) -> Point | None:
        """The best complete trial's setting (the first of equals)."""
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and self.covers(t.params)]
        if not done:
            return None
        top = max(done, key=lambda t: (float(t.value or 0.0) * (1 if maximize else -1), -t.number))
        return self.point(top.params)

    def line(self, point: Point, field: int) -> list[Point]:
        """The settings that differ from `point` in field number `field` only, in its list's order."""
        values = list(self.space.values())[field]
        return [point[:field] + (v,) + point[field + 1:] for v in values if v != point[field]]

    def neighbours(self, point: Point) -> list[Point]:
        """Every setting that differs from `point` in one field, field by field."""
        return [p for field in range(len(self.space)) for p in self.line(point, field)]

    def middle(self) -> Point:
        return tuple(values[len(values) // 2] for values in self.space.values())

    def all_points(self) -> list[Point]:
        points: list[Point] = [()]
        for values in self.space.values():
            points = [p + (v,) for p in points for v in values]
        return points

    def covers(self, params: dict) -> bool:
        return all(f in params and params[f] in values for f, values in self.space.items())

    def point(self, params: dict) -> Point:
        return tuple(params[f] for f in self.space)

    def setting(self, point: Point) -> dict:
        return dict(zip(self.space, point, strict=True))


def sweep_size(space: dict[str, list]) -> int:
    """Trials of one sweep of every field: the middle setting and each field's other values."""
    return 1 + sum(len(values) - 1 for values in space.values())


def untried_neighbours(space: dict[str, list], best: dict, tried: list[dict]) -> list[dict]:
    """The one-field changes of `best` that no trial ran (empty: best is a local optimum along every field)."""
    sampler = AxisSampler(space)
    run = {sampler.point(t) for t in tried if sampler.covers(t)}
    return [sampler.setting(p) for p in sampler.neighbours(sampler.point(best)) if p not in run]
