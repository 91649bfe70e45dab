"""Training methods: one file each, registered by name (importing each file below fills the registry),
plus the parts they share: base (the Method protocol), outer (the outer loop's options, its sync plan
and fragments), rounds, sparsifiers. How to add one: docs/ARCHITECTURE.md."""

from lowband.methods import (  # noqa: F401
    afsd,
    allreduce,
    codistill,
    diloco,
    ec_dnn,
    edl,
    ensemble,
    gossip,
    local_sgd,
    single,
    sparseloco,
    topk,
)
from lowband.methods.base import Context, Method

__all__ = ["Context", "Method"]
