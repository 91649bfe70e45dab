"""lowband: training neural networks on workers that cannot afford to talk every step.

From Python (see lowband.api):

    import lowband
    run = lowband.train(method="local_sgd", workers=2, epochs=1, **{"method.tau": 4})
    model = lowband.load_model(run.run_dir)

In your own training loop (see lowband.wrapping):

    sync = lowband.wrap(model, optimizer, "sparseloco:tau=8")   # under torchrun
    ... loss.backward(); optimizer.step(); optimizer.zero_grad(); sync.step()
"""

import importlib

from lowband.errors import ConfigError, LowbandError, RunFailed, UsageError

__version__ = "0.1.0"

__all__ = ["Comparison", "ConfigError", "LowbandError", "Run", "RunFailed", "Sync", "UsageError", "__version__",
           "compare", "load_model", "train", "wrap"]

_API = {"train": "lowband.api", "compare": "lowband.api", "load_model": "lowband.api", "Run": "lowband.api",
        "Comparison": "lowband.api", "wrap": "lowband.wrapping", "Sync": "lowband.wrapping"}


def __getattr__(name: str):
    """The API is imported on first use, so `import lowband` (and the CLI) stays cheap."""
    if name in _API:
        # imported by name at first use, after this package has finished importing: the API sits on top
        # of every layer, and the package itself imports nothing but lowband.errors. No submodule is
        # named like an API function (a comparison's code lives in lowband.comparison), so
        # `lowband.compare` is always the function.
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'lowband' has no attribute {name!r}")
