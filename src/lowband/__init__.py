"""lowband: training neural networks on workers that cannot afford to talk every step.

From Python (see lowband.api):

    import lowband
    run = lowband.train(method="local_sgd", workers=2, epochs=1, **{"method.tau": 4})
    model = lowband.load_model(run.run_dir)
"""

import importlib

from lowband.errors import ConfigError, LowbandError, RunFailed, UsageError

__version__ = "0.1.0"

__all__ = ["Comparison", "ConfigError", "LowbandError", "Run", "RunFailed", "UsageError", "__version__", "compare",
           "load_model", "train"]

_API = {"train", "compare", "load_model", "Run", "Comparison"}


def __getattr__(name: str):
    """The API is imported on first use, so `import lowband` (and the CLI) stays cheap."""
    if name in _API:
        # imported by name at first use, after this package has finished importing: the API sits on top
        # of every layer, and the package itself imports nothing but lowband.errors. No submodule is
        # named like an API function (a comparison's code lives in lowband.comparison), so
        # `lowband.compare` is always the function.
        return getattr(importlib.import_module("lowband.api"), name)
    raise AttributeError(f"module 'lowband' has no attribute {name!r}")
