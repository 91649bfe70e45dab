"""Your own code by name: `package.module:factory` strings for models, data sets and loggers."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from lowband.errors import ConfigError


def import_factory(spec: str, field: str) -> Callable:
    """The callable `spec` ('package.module:factory') names; any failure is one ConfigError naming `field`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(field, spec, "expected package.module:factory")
    try:
        factory = getattr(_import(module_name), attr)
    except Exception as e:  # noqa: BLE001 - user code: any import-time failure is the user's to fix
        raise ConfigError(field, spec, f"could not import the factory ({type(e).__name__}: {e})") from None
    if not callable(factory):
        raise ConfigError(field, spec, f"{attr} is a {type(factory).__name__}, not a callable factory "
                                       f"(it is not callable)")
    return factory


def _import(module_name: str):
    """The module, found as `python -m lowband` in this directory would find it: the `lowband` command's
    own path does not hold the working directory, so a module there is looked for in it too."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if e.name != module_name.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, here)
        return importlib.import_module(module_name)
