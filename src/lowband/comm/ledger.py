"""The byte ledger: per tag, the bytes a rank put on the wire and took off it, and the seconds it waited.

Every byte lowband counts reaches one `Ledger` through one of two entry points, and the modelled slow
link (net/links.py's LinkModel) is reserved here and nowhere else:
  count    the communicator's collectives and point-to-point calls (comm/communicator.py), which
           measure their tensors with the byte model below; `links` reserves the modelled link for
           bytes whose wait comes later (a posted exchange, DDP's asynchronous allreduce)
  outside  bytes that travel outside a collective (a checkpoint written to or read from shared storage,
           a prediction server's answers, teachers' soft labels), handed over by their mover as one
           `Traffic`; the caller is held for a modelled link's transfer time, then they are counted

Byte model, per rank, for S bytes and K ranks. Point-to-point calls are exact: the payload size.
Collectives whose algorithm the backend hides are counted with the ring model:
  allreduce   sent = recv = 2(K-1)/K * S      (reduce-scatter then all-gather around a ring)
  all_gather  sent = recv = (K-1) * S         (S is one rank's part)
  broadcast   a chain from the source: every rank but the last forwards S, every rank but the source receives S
  reduce      a tree into the destination: every rank but it sends S once (counted as sent to it), it
              receives (K-1) * S
Collectives over K = 1 move nothing and count nothing.

Bytes across sites (lowband.net.sites). Each tag also counts `inter`: the bytes this rank sent that
cross a site boundary. Point-to-point calls are exact, by the peer's site. Collectives are counted as
the flat ring above, over the communicator's ranks in rank order (sites are consecutive ranks, so the
ring is ordered by site): a rank sends all its ring bytes to the next rank, so they are inter-site
bytes exactly when the next rank sits in another site. A ring over K ranks in S sites has S of its K
edges crossing when S > 1 (none when S = 1), and a communicator from `split` whose ranks share one
site counts no inter bytes. The broadcast chain is the ring less the edge into the source. Without a
site map every rank is its own site, so every byte sent is an inter-site byte.

Communicators made from one another (split, alone, an elastic quorum's) share their ledger.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import NamedTuple

from lowband.net.links import LinkModel


@dataclass
class TagStats:
    sent: float = 0.0
    recv: float = 0.0
    calls: int = 0
    seconds: float = 0.0
    wire: float = 0.0  # bytes on this rank's busiest link per call, summed: what a modelled link delays
    inter: float = 0.0  # bytes sent across a site boundary (lowband.net.sites)


class Traffic(NamedTuple):
    """Bytes moved, as their mover hands them to the ledger (and the collectives' formulas below give them):
    `sent` and `recv` by this process, and `inter`, those of `sent` that crossed a site boundary (None:
    all of `sent` when the traffic crosses, none otherwise)."""

    sent: float = 0.0
    recv: float = 0.0
    inter: float | None = None


class Tally:
    """Bytes that threads other than the training loop move (a prediction server's answers, a reader's
    soft labels), added up under a lock until the loop takes them into its ledger (`Ledger.outside`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sent = self._recv = self._inter = 0.0

    def add(self, sent: float = 0.0, recv: float = 0.0, inter: float = 0.0) -> None:
        with self._lock:
            self._sent, self._recv, self._inter = self._sent + sent, self._recv + recv, self._inter + inter

    def take(self, with_inter: bool = True) -> Traffic:
        """What was added since the last take, and zero again; `with_inter` False: inter None (the
        taker's ledger decides whether it crossed)."""
        with self._lock:
            taken = Traffic(self._sent, self._recv, self._inter if with_inter else None)
            self._sent = self._recv = self._inter = 0.0
        return taken


def allreduce_traffic(nbytes: float, world: int) -> Traffic:
    """What each rank sends and receives in a ring allreduce of `nbytes` over `world` ranks."""
    size = 2 * (world - 1) / world * nbytes
    return Traffic(size, size)


def all_gather_traffic(nbytes: float, world: int) -> Traffic:
    """What each rank sends and receives gathering a part of `nbytes` from every one of `world` ranks."""
    size = (world - 1) * nbytes
    return Traffic(size, size)


def broadcast_traffic(nbytes: float, world: int, position: int) -> Traffic:
    """What the rank `position` steps down a chain broadcast of `nbytes` sends and receives (0: the source)."""
    return Traffic(nbytes if position < world - 1 else 0.0, nbytes if position > 0 else 0.0)


def reduce_traffic(nbytes: float, world: int, is_destination: bool) -> Traffic:
    """What a rank sends and receives in a reduce of `nbytes` to one destination."""
    return Traffic(0.0, (world - 1) * nbytes) if is_destination else Traffic(nbytes, 0.0)


class Ledger:
    """Counters per tag; `link`, when set, is the modelled slow link every counted byte waits on."""

    def __init__(self, link: LinkModel | None = None):
        self.stats: dict[str, TagStats] = defaultdict(TagStats)
        self.link = link

    def count(self, tag: str, sent: float = 0.0, recv: float = 0.0, seconds: float = 0.0,
              wire: float | None = None, inter: float = 0.0,
              links: Iterable[tuple[object, float, bool]] = ()) -> float:
        """Add one call to `tag`; `wire`: its bytes on the busiest link (default all `sent`, one link);
        `inter`: those of `sent` that cross a site boundary. `links`: (link, bytes, crosses) for each
        modelled link the call's bytes take; returns the monotonic time they have all arrived, which the
        caller waits for when its operation completes (0: no modelled link)."""
        ready = max((self.link.reserve(link, n, crosses) for link, n, crosses in links),
                    default=0.0) if self.link is not None else 0.0
        s = self.stats[tag]
        s.wire += sent if wire is None else wire
        s.inter += inter
        s.sent += sent
        s.recv += recv
        s.seconds += seconds
        s.calls += 1
        return ready

    def outside(self, tag: str, moved: Traffic, crosses: bool = False, peer="store", seconds: float = 0.0,
                reply_peer=None, pipelined: bool = False) -> None:
        """Bytes that travelled outside a collective: held for a modelled link's transfer time (the sent
        bytes on `peer`'s link; None: on none, another process's ledger models their wait), then counted,
        `crosses` saying whether they left the site. `reply_peer`: the received bytes held a link of
        their own too (a teacher's answers; `peer` itself: a request and its answer one after the other
        on one link), and the caller waits for the later of the two; `pipelined`: a stream kept in
        flight, whose latency overlaps."""
        t0 = time.perf_counter()
        sent, recv, inter = moved
        if self.link is not None and peer is not None and reply_peer is not None and (sent or recv):
            self.link.wait_until(max(self.link.reserve(peer, sent, crosses, pipelined),
                                     self.link.reserve(reply_peer, recv, crosses, pipelined)))
        elif self.link is not None and peer is not None and sent:
            self.link.wait_until(self.link.reserve(peer, sent, crosses, pipelined))
        inter = (sent if crosses else 0.0) if inter is None else inter
        self.count(tag, sent, recv, seconds + time.perf_counter() - t0, inter=inter)

    def add_time(self, tag: str, seconds: float) -> None:
        self.stats[tag].seconds += seconds

    def seconds(self, leave_out: frozenset[str] = frozenset()) -> float:
        """Seconds counted over every tag but `leave_out`."""
        return sum(s.seconds for tag, s in self.stats.items() if tag not in leave_out)

    def traffic_by_tag(self) -> dict[str, dict[str, float]]:
        """{tag: {"sent": bytes, "recv": bytes}} for every tag that moved any (what an elastic worker publishes)."""
        return {tag: {"sent": s.sent, "recv": s.recv} for tag, s in self.stats.items() if s.sent or s.recv}

    def snapshot(self) -> dict[str, dict]:
        return {tag: asdict(s) for tag, s in self.stats.items()}

    def load_snapshot(self, snap: dict[str, dict]) -> None:
        self.stats.clear()
        for tag, values in snap.items():
            self.stats[tag] = TagStats(**values)
