"""Training methods: one file each, registered by name."""

from lowband.methods import allreduce, ec_dnn, ensemble, gossip, local_sgd, single, topk  # noqa: F401
from lowband.methods.base import Context, Method

__all__ = ["Context", "Method"]
