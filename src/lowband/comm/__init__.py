"""Everything that crosses a process boundary: the communicator (communicator, the one torch.distributed
importer) and its byte ledger (ledger); value_codecs and index_codecs, random masks (masks), compressed
means (reduce), averaging, hierarchy; links, sites and who talks to whom (topology); the checkpoint
store (store); each local rank's device and the backend (placement); who takes an outer step (quorum:
a fixed world; elastic_quorum: an elastic job's, met at every outer step; meet: where and when a worker
meets), an elastic job's membership and rendezvous in Redis (membership, rendezvous). See docs/ARCHITECTURE.md."""

from lowband.comm.communicator import Communicator, launched_by_torchrun

#: tags for the framework's own bookkeeping (reporting, evaluating a global model for the
#: metrics), reported apart from a method's training traffic
BOOKKEEPING_TAGS = frozenset({"metrics", "control", "barrier", "eval"})

__all__ = ["Communicator", "launched_by_torchrun", "BOOKKEEPING_TAGS"]
