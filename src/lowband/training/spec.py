"""A run resolved once, before anything starts: `RunSpec` (world, sites, method class, groups).

`resolve(cfg)` checks what a run's shape depends on (the method's worker count and its own checks,
a language model refused by a method that cannot train one, a site map that cuts no method group)
and returns the answers; the launcher, the comparison's plan and its summary read them from the
spec instead of asking again. A bad value raises ConfigError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband import config as C
from lowband.data.metric import task_of
from lowband.errors import ConfigError
from lowband.methods.base import Method
from lowband.net.sites import check_groups, configured
from lowband.registry import METHODS


@dataclass(frozen=True)
class RunSpec:
    """What a config means for the processes it starts."""

    cfg: C.Config
    method: type[Method]  # the method's class
    world: int  # worker processes
    site_of: list[int]  # each rank's site (all 0 without a site map)
    groups: list[list[int]] | None  # the method's groups of ranks (codistillation's replicas), None: one

    @property
    def sites(self) -> list[int] | None:
        """The configured site map (None: the run has no sites), for the launcher's namespaces."""
        return self.site_of if configured(self.cfg.link.sites, self.cfg.link.site_of) else None


def resolve(cfg: C.Config, world: int | None = None) -> RunSpec:
    """`cfg` checked and resolved; `world`: the worker count when someone else chose it (torchrun),
    else the method's fixed count or train.workers."""
    method = METHODS.get(cfg.method.name)
    world = world or method.fixed_workers or cfg.train.workers
    if world < method.min_workers:
        raise ConfigError("train.workers", world, f"method {cfg.method.name} needs at least {method.min_workers} workers")
    method.check(cfg.method, world)
    C.check_threads(cfg.train.threads, "train.threads")
    if method.language_model_refused and task_of(cfg.data.name) == "lm":
        raise ConfigError("method.name", cfg.method.name, f"cannot train a language model ({cfg.data.name}): "
                                                          f"{method.language_model_refused}")
    groups = method.groups(cfg.method, world)
    site_of = cfg.link.site_map(world)
    if configured(cfg.link.sites, cfg.link.site_of):
        check_groups(site_of, groups, "method.group_size", getattr(cfg.method, "group_size", None))
    return RunSpec(cfg, method, world, site_of, groups)
