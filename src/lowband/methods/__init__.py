"""Training methods: one file each, registered by name."""

from lowband.methods import (  # noqa: F401  (fill the registry)
    afsd, allreduce, codistill, diloco, ec_dnn, edl, ensemble, gossip, local_sgd, single, topk)
from lowband.methods.base import Context, Method

__all__ = ["Context", "Method"]
