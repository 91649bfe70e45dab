"""Training methods: one file each, registered by name."""

from lowband.methods import allreduce, ec_dnn, ensemble, local_sgd, single  # noqa: F401  (fill the registry)
from lowband.methods.base import Context, Method

__all__ = ["Context", "Method"]
