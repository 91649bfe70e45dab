"""Everything that crosses a process boundary."""

from lowband.comm.communicator import Communicator, launched_by_torchrun

#: tags for the framework's own bookkeeping, reported apart from a method's training traffic
BOOKKEEPING_TAGS = frozenset({"metrics", "control", "barrier"})

__all__ = ["Communicator", "launched_by_torchrun", "BOOKKEEPING_TAGS"]
