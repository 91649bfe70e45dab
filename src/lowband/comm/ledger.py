"""The byte ledger: per tag, the bytes a rank put on the wire and took off it, and the seconds it waited.

Every byte lowband counts goes through one `Ledger`: the communicator's collectives and point-to-point
calls (comm/communicator.py), and the bytes that travel outside a collective (a checkpoint written to
shared storage, a prediction server's answers, teachers' soft labels) through `outside`, which also
holds the caller for a modelled link's transfer time. What each collective moves per rank, for S
bytes and K ranks, is written here once (the communicator only measures S and runs the operation):

  allreduce   sent = recv = 2(K-1)/K * S      (reduce-scatter then all-gather around a ring)
  all_gather  sent = recv = (K-1) * S         (S is one rank's part)
  broadcast   a chain from the source: every rank but the last sends S, every rank but the source receives S
  reduce      every rank but the destination sends S; the destination receives (K-1) * S

Communicators made from one another (split, alone, an elastic quorum's) share their ledger.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from lowband.comm.links import LinkModel


@dataclass
class TagStats:
    sent: float = 0.0
    recv: float = 0.0
    calls: int = 0
    seconds: float = 0.0
    wire: float = 0.0  # bytes on this rank's busiest link per call, summed: what a modelled link delays
    inter: float = 0.0  # bytes sent across a site boundary (lowband.comm.sites)


def ring_allreduce_bytes(nbytes: float, world: int) -> float:
    """Bytes each rank sends (and receives) in a ring allreduce of `nbytes` over `world` ranks."""
    return 2 * (world - 1) / world * nbytes


def all_gather_bytes(nbytes: float, world: int) -> float:
    """Bytes each rank sends (and receives) gathering a part of `nbytes` from every one of `world` ranks."""
    return (world - 1) * nbytes


def broadcast_bytes(nbytes: float, world: int, position: int) -> tuple[float, float]:
    """(sent, received) by the rank `position` steps down a chain broadcast of `nbytes` (0: the source)."""
    return (nbytes if position < world - 1 else 0.0), (nbytes if position > 0 else 0.0)


def reduce_bytes(nbytes: float, world: int, is_destination: bool) -> tuple[float, float]:
    """(sent, received) by a rank in a reduce of `nbytes` to one destination."""
    return (0.0, (world - 1) * nbytes) if is_destination else (nbytes, 0.0)


class Ledger:
    """Counters per tag; `link`, when set, is the modelled slow link every counted byte waits on."""

    def __init__(self, link: LinkModel | None = None):
        self.stats: dict[str, TagStats] = defaultdict(TagStats)
        self.link = link

    def count(self, tag: str, sent: float = 0.0, recv: float = 0.0, seconds: float = 0.0,
              wire: float | None = None, inter: float = 0.0) -> None:
        """Add one call to `tag`; `wire`: its bytes on the busiest link (default all `sent`, one link);
        `inter`: those of `sent` that cross a site boundary."""
        s = self.stats[tag]
        s.wire += sent if wire is None else wire
        s.inter += inter
        s.sent += sent
        s.recv += recv
        s.seconds += seconds
        s.calls += 1

    def outside(self, tag: str, sent: float, recv: float = 0.0, crosses: bool = False, peer="store",
                seconds: float = 0.0, reply_peer=None, pipelined: bool = False) -> None:
        """Bytes that travelled outside a collective: held for a modelled link's transfer time (to
        `peer`'s link), then counted, `crosses` saying whether they left the site. `reply_peer`: the
        received bytes held a link of their own too (a teacher's answers), and the caller waits for the
        later of the two; `pipelined`: a stream kept in flight, whose latency overlaps."""
        t0 = time.perf_counter()
        if self.link is not None and reply_peer is not None and (sent or recv):
            self.link.wait_until(max(self.link.reserve(peer, sent, crosses, pipelined),
                                     self.link.reserve(reply_peer, recv, crosses, pipelined)))
        elif self.link is not None and sent:
            self.link.wait_until(self.link.reserve(peer, sent, crosses, pipelined))
        self.count(tag, sent, recv, seconds + time.perf_counter() - t0, inter=sent if crosses else 0.0)

    def add_time(self, tag: str, seconds: float) -> None:
        self.stats[tag].seconds += seconds

    def seconds(self, leave_out: frozenset[str] = frozenset()) -> float:
        """Seconds counted over every tag but `leave_out`."""
        return sum(s.seconds for tag, s in self.stats.items() if tag not in leave_out)

    def sent_by_tag(self) -> dict[str, float]:
        return {tag: s.sent for tag, s in self.stats.items() if s.sent}

    def snapshot(self) -> dict[str, dict]:
        return {tag: asdict(s) for tag, s in self.stats.items()}

    def load_snapshot(self, snap: dict[str, dict]) -> None:
        self.stats.clear()
        for tag, values in snap.items():
            self.stats[tag] = TagStats(**values)
