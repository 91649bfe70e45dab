"""What a user asks of a comparison, read once, and the plan it becomes.

The command line (and the Python API) turn their arguments into one `Request`; `plan_for(request)`
resolves it into the comparison's `Plan` and a new directory, every run checked before any starts.
Nothing below this reads command-line arguments. A suite is a TOML file of methods and settings:
the built-in ones live in lowband/suites/.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from importlib import resources

from lowband import config as C
from lowband.comparison import plan as P
from lowband.errors import ConfigError, UsageError


@dataclass(frozen=True)
class Request:
    """A comparison as asked for. `methods` None: the suite's; `suite` a built-in name, `suite_file`
    a TOML with `methods = [...]`, `config_file` a plain config TOML used as the base settings,
    `base` those settings as a nested dict (then no suite is read: the Python API's way);
    `overrides` the command line's settings (shortcut flags and --set), nested by section; `budget`
    None: the suite's (its `budget` key, else "epochs")."""

    methods: list[str] | None = None
    suite: str | None = None
    suite_file: str | None = None
    config_file: str | None = None
    base: dict | None = None
    overrides: dict = field(default_factory=dict)
    seeds: list[int] | None = None
    tune: P.Tune | None = None
    budget: str | None = None
    out: str = "runs"


def plan_for(request: Request) -> tuple[P.Plan, str]:
    """(the comparison's plan, its new directory), every run's config checked; nothing runs yet."""
    if request.suite and (request.suite_file or request.config_file):
        raise UsageError("--suite and --config both name a suite; give one")
    if request.base is not None:
        suite: dict = {"config": request.base, "methods": [], "prepare": [], "per_method": {}, "method_defaults": {}}
    else:
        suite = load_suite(path=request.suite_file) if request.suite_file else load_suite(request.suite or "quick")
    base = C.read_toml(request.config_file) if request.config_file else suite["config"]
    methods = request.methods if request.methods is not None else suite["methods"]
    if not methods:
        raise UsageError("--methods names no method")
    prepare = suite["prepare"] if request.methods is None or uses_the_folder(suite, methods) else []
    if request.methods is None:  # --methods may pick some of a suite's methods; the suite's own list must fit it
        check_per_method(suite.get("per_method") or {}, list(methods))
    folder = new_folder(request.out)
    plan = P.make_plan(list(methods), base, request.overrides, folder, seeds=request.seeds, tune=request.tune,
                       suite={**suite, "prepare": prepare}, budget=request.budget or suite.get("budget", "epochs"))
    return plan, folder


def uses_the_folder(suite: dict, specs: list[str]) -> bool:
    """Whether a chosen method's settings from the suite (plan.spec_config's) name "{folder}" (EDL's
    teacher, say): what the suite's `prepare` commands write there. `--suite lm --methods edl` then
    still trains the teacher first; `--suite lm --methods allreduce` does not."""
    return any("{folder}" in json.dumps(P.spec_config(spec, suite.get("config") or {}, {}, suite.get("per_method"),
                                                      suite.get("method_defaults"))) for spec in specs)


def check_per_method(per_method: dict, specs: list[str]) -> None:
    """Every [per_method.KEY] table of a suite applies to one of its methods (NAME: to NAME and its NAME:...
    variants; "NAME:OPTIONS": to that spec); one that applies to none is a ConfigError, not ignored."""
    def applies(key: str, spec: str) -> bool:
        return key == spec or (":" not in key and P.parse_spec(spec)[0] == key)

    for key, table in per_method.items():
        if not any(applies(key, spec) for spec in specs):
            raise ConfigError(f"per_method.{key}", table, f"applies to no method this suite runs ({', '.join(specs)}); "
                                                          "name one of them, or add it to methods")


def is_suite_file(path: str) -> bool:
    """Whether a --config TOML is a suite (it lists methods) rather than a plain config."""
    return "methods" in C.read_toml(path)


def new_folder(out: str) -> str:
    """A new comparison directory's path under `out` (created when the comparison starts)."""
    path, n = os.path.join(out, "compare-" + time.strftime("%Y%m%d-%H%M%S")), 1
    while os.path.exists(path if n == 1 else f"{path}-{n}"):
        n += 1
    return path if n == 1 else f"{path}-{n}"


def suite_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("lowband").joinpath("suites").iterdir() if p.name.endswith(".toml"))


def load_suite(name: str | None = None, path: str | None = None) -> dict:
    """A suite: {description, methods, target, config, prepare, method_defaults, per_method, budget};
    `name` is built in, `path` a user's TOML file. `target` (None: Allreduce) names the reference method: its
    final validation figure is the table's target, its time the speed-up's base, and a target budget's."""
    if name is not None:
        if name not in suite_names():
            raise UsageError(f"unknown suite {name!r}; known: {', '.join(suite_names())} (or --config FILE)")
        with resources.as_file(resources.files("lowband").joinpath("suites", f"{name}.toml")) as built_in:
            raw = C.read_toml(str(built_in), f"suite {name}")
    else:
        assert path is not None, "a suite is a name or a path"
        raw = C.read_toml(path)
    methods = raw.get("methods")
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        raise ConfigError("methods", methods, "a suite needs methods = [\"name\", \"name:key=value\", ...]")
    prepare = raw.get("prepare", [])
    if not isinstance(prepare, list) or not all(isinstance(c, str) for c in prepare):
        raise ConfigError("prepare", prepare, "a list of lowband commands, e.g. [\"train --method single ...\"]")
    defaults = raw.get("method_defaults", {})
    if not isinstance(defaults, dict) or not all(isinstance(v, dict) for v in defaults.values()):
        raise ConfigError("method_defaults", defaults, "tables of options per method, e.g. [method_defaults.edl]")
    per_method = raw.get("per_method", {})
    if not isinstance(per_method, dict) or not all(isinstance(v, dict) for v in per_method.values()):
        raise ConfigError("per_method", per_method, "tables of settings per method, e.g. [per_method.local_sgd] "
                                                    "with optim.lr = 0.2")
    target = raw.get("target")
    names = [m.split(":")[0] for m in methods]
    if target is not None and target not in names:
        raise ConfigError("target", target, "names the suite's reference method, one of its methods: "
                                            + ", ".join(dict.fromkeys(names)))
    return {"description": raw.get("description", ""), "methods": methods, "config": raw.get("config", {}),
            "target": target, "prepare": prepare, "method_defaults": defaults,
            "per_method": per_method, "budget": suite_budget(raw.get("budget", "epochs"))}


def suite_budget(budget) -> str:
    """A suite's `budget` key, checked as --budget is (the command line's --budget overrides it)."""
    try:
        P.parse_budget(budget if isinstance(budget, str) else "")
    except ConfigError as error:
        raise ConfigError("budget", budget, error.allowed) from None
    return budget


