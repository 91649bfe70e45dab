"""Training methods: one file each, registered by name."""

from lowband.methods import afsd, allreduce, codistill, diloco, ec_dnn, edl, ensemble, gossip, local_sgd, single, topk  # noqa: F401  (fill the registry)
from lowband.methods.base import Context, Method

__all__ = ["Context", "Method"]
