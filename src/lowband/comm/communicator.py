"""The one place that talks to torch.distributed.

Every call carries a tag ("grad", "params", "ckpt", ...) and hands the communicator's byte ledger
(comm/ledger.py) the bytes this rank put on the wire and took off it, and the seconds it spent blocked
in the call. The communicator measures each tensor and runs the operation; what a collective moves per
rank (the ring model), which of its bytes cross a site boundary, and the modelled link's wait are the
ledger's, described there once.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from lowband.comm.ledger import Ledger, Traffic, all_gather_traffic, allreduce_traffic, broadcast_traffic, reduce_traffic
from lowband.comm.placement import here, local_world
from lowband.net.links import UNLIMITED, LinkModel, LinkSpec


def launched_by_torchrun() -> bool:
    """True in a process started by torchrun (or any launcher exporting RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOWBAND_WORKER" not in os.environ


def pick_backend(requested: str, device: torch.device) -> str:
    """train.backend `requested` for a rank on `device`: `auto` as comm/placement.py decides for the ranks
    on this machine (nccl only when each has a GPU of its own)."""
    if requested != "auto":
        return requested
    return here(device.type, requested, local_world()).backend


class Communicator:
    """Tagged, byte-counting collectives and point-to-point calls over one process group."""

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None, group=None,
                 global_ranks: list[int] | None = None, site_of: list[int] | None = None):
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")
        self.group = group
        self.global_ranks = global_ranks or list(range(world))  # torch.distributed names peers globally
        self.site_of = site_of  # site of each global rank; None: every rank its own site
        self.ledger = Ledger()  # every byte this rank counts (comm/ledger.py), shared with split-off communicators
        self._launched_at: float | None = None

    # ---- life cycle -------------------------------------------------------------------------
    @property
    def link(self) -> LinkModel | None:
        """The modelled slow link every sent byte waits on (None: the real network alone)."""
        return self.ledger.link

    @classmethod
    def from_env(cls, device: torch.device, backend: str = "auto", timeout_s: float = 300.0,
                 link: LinkSpec | None = None, sites=None, intra: LinkSpec | None = None) -> Communicator:
        """Join the process group described by the environment (our launcher's or torchrun's);
        `sites(world)`: the site of each rank (None: every rank its own site); `link` the modelled link
        between sites and `intra` the one inside a site (None: unlimited)."""
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if world == 1:
            return cls(0, 1, device)
        comm = cls._join(rank, world, device, backend, timeout_s)
        comm.site_of = sites(world) if sites is not None else None
        link, intra = link or UNLIMITED, intra or UNLIMITED
        comm.ledger.link = LinkModel(link, intra) if link.limited or intra.limited else None
        return comm

    @classmethod
    def _join(cls, rank: int, world: int, device: torch.device, backend: str, timeout_s: float) -> Communicator:
        init_file = os.environ.get("LOWBAND_INIT_FILE")
        dist.init_process_group(
            backend=pick_backend(backend, device),
            init_method=f"file://{init_file}" if init_file else "env://",
            rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
        )
        return cls(rank, world, device, dist.group.WORLD)

    @classmethod
    def over_store(cls, store, rank: int, world: int, device: torch.device, timeout_s: float,
                   ledger: Ledger | None = None, host: str = "127.0.0.1") -> Communicator:
        """A communicator over a gloo group of its own, whose ranks meet through `store` (a torch.distributed
        store, or any object with set, get, add, check, wait, delete_key and num_keys, such as
        comm/rendezvous.py's RedisStore),
        counting into `ledger`; this rank listens on `host`. Such a group is not torch.distributed's default one:
        collectives work on it, point-to-point calls do not (`p2p` is False). `close()`, or dropping
        it, ends it."""
        group = None
        if world > 1:
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            options._timeout = timedelta(seconds=timeout_s)
            group = dist.ProcessGroupGloo(store if isinstance(store, dist.Store) else _Store(store), rank, world,
                                          options)
        comm = cls(rank, world, device, group)
        comm.p2p = False
        if ledger is not None:
            comm.ledger = ledger
        return comm

    @classmethod
    def over_tcp_store(cls, address: str, port: int, rank: int, world: int, device: torch.device, timeout_s: float,
                       serve: bool, prefix: str, host: str = "127.0.0.1") -> Communicator:
        """`over_store` on a torch TCP store at address:port (torchrun's rendezvous store, say), its keys under
        `prefix`; `serve`: this rank hosts the store (False when torchrun's agent does)."""
        store = dist.TCPStore(address, port, world, is_master=serve, timeout=timedelta(seconds=timeout_s))
        return cls.over_store(dist.PrefixStore(prefix, store), rank, world, device, timeout_s, host=host)

    p2p = True  # point-to-point calls work (False on a group built by over_store)

    def split(self, groups: list[list[int]]) -> Communicator:
        """A communicator over this rank's group (ranks renumbered 0..g-1), sharing these byte counters.

        Every rank must call it with the same `groups`: torch.distributed creates each group on all ranks.
        """
        mine = None
        for ranks in groups:
            group = dist.new_group(ranks) if self.world > 1 else None
            if self.rank in ranks:
                mine = (ranks, group)
        assert mine is not None, f"rank {self.rank} is in none of the groups {groups}"
        ranks, group = mine
        sub = Communicator(ranks.index(self.rank), len(ranks), self.device, group if len(ranks) > 1 else None,
                           [self.global_ranks[r] for r in ranks], self.site_of)
        sub.ledger = self.ledger
        return sub

    def alone(self) -> Communicator:
        """A communicator of this rank alone (collectives move nothing), sharing these byte counters."""
        solo = Communicator(0, 1, self.device, None, [self.global_ranks[self.rank]], self.site_of)
        solo.ledger = self.ledger
        return solo

    def _peer(self, rank: int) -> int:
        return self.global_ranks[rank]

    def site(self, rank: int) -> int:
        """The site of this communicator's `rank` (without a site map: its global rank)."""
        peer = self._peer(rank)
        return peer if self.site_of is None else self.site_of[peer]

    def crosses(self, rank: int) -> bool:
        """True when bytes from this rank to `rank` cross a site boundary."""
        return self.site(rank) != self.site(self.rank)

    def spans_sites(self) -> bool:
        """True when this communicator's ranks sit in more than one site."""
        return len({self.site(r) for r in range(self.world)}) > 1

    def _next(self) -> int:
        """The next rank on the ring: where a collective's bytes go (see the byte model in comm/ledger.py)."""
        return (self.rank + 1) % self.world

    def close(self, clean: bool = False) -> None:
        """Leave the process group; after a clean finish, first wait until every rank has finished so
        no rank tears the group down under a peer's last collective (gloo aborts the peer otherwise)."""
        if not self.p2p:  # a group of our own (over_store): nothing to tear down but the object
            self.group = None
        if self.group is not None and dist.is_initialized():
            if clean:
                dist.barrier(group=self.group)
            dist.destroy_process_group()
            self.group = None

    @property
    def backend(self) -> str:
        if self.group is None:
            return "none"
        return dist.get_backend(self.group) if self.p2p else "gloo"

    # ---- accounting -------------------------------------------------------------------------
    def stored(self, tag: str, nbytes: int) -> None:
        """A write to shared storage: inter-site bytes when the ranks span several sites (readers in
        another site fetch it across), held for its transfer time by a modelled link (ledger.outside)."""
        self.ledger.outside(tag, Traffic(nbytes), crosses=self.spans_sites())

    def _host(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself, or a host copy of it where gloo cannot take a CUDA tensor (point-to-point,
        reduce, all-gather: workers sharing a GPU talk through gloo, which stages through host memory
        anyway); `_back` copies a received host copy into the tensor."""
        return tensor.cpu() if tensor.is_cuda and self.backend == "gloo" else tensor

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed(self, tag: str, moved: Traffic, fn, to: int | None = None):
        """Run `fn`, whose sent bytes go to rank `to` (None: the next rank on the ring), and count `moved`."""
        t0 = time.perf_counter()
        out = fn()
        self._sync()
        key, inter = ("ring" if to is None else to), self.crosses(self._next() if to is None else to)
        self.ledger.outside(tag, moved, crosses=inter, peer=key, seconds=time.perf_counter() - t0)
        return out

    # ---- collectives ------------------------------------------------------------------------
    def allreduce(self, tensor: torch.Tensor, tag: str, mean: bool = False) -> torch.Tensor:
        """Sum (or average) `tensor` across ranks in place."""
        if self.world > 1:
            self._timed(tag, allreduce_traffic(_nbytes(tensor), self.world),
                        lambda: dist.all_reduce(tensor, group=self.group))
        if mean and self.world > 1:
            tensor.div_(self.world)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int, tag: str) -> torch.Tensor:
        if self.world > 1:
            moved = broadcast_traffic(_nbytes(tensor), self.world, (self.rank - src) % self.world)
            self._timed(tag, moved, lambda: dist.broadcast(tensor, group=self.group, group_src=src))
        return tensor

    def reduce(self, tensor: torch.Tensor, dst: int, tag: str) -> torch.Tensor:
        """Sum `tensor` across ranks into rank `dst`'s copy (other ranks' copies are left undefined)."""
        if self.world > 1:
            moved = reduce_traffic(_nbytes(tensor), self.world, self.rank == dst)
            host = self._host(tensor)
            self._timed(tag, moved, lambda: dist.reduce(host, dst=self._peer(dst), group=self.group), to=dst)
            _back(host, tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, tag: str) -> list[torch.Tensor]:
        """Every rank's `tensor` (same shape on all ranks), in rank order."""
        if self.world == 1:
            return [tensor.clone()]
        host = self._host(tensor.contiguous())
        parts = [torch.empty_like(host) for _ in range(self.world)]
        self._timed(tag, all_gather_traffic(_nbytes(tensor), self.world),
                    lambda: dist.all_gather(parts, host, group=self.group))
        return [p.to(tensor.device) for p in parts]

    def barrier(self, tag: str = "barrier") -> float:
        """Wait for every rank; returns the seconds waited (counted as waiting, not bytes)."""
        if self.world == 1:
            return 0.0
        t0 = time.perf_counter()
        dist.barrier(group=self.group)
        waited = time.perf_counter() - t0
        self.ledger.add_time(tag, waited)
        return waited

    # ---- point to point ---------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, tag: str) -> None:
        host = self._host(tensor.contiguous())
        self._timed(tag, Traffic(_nbytes(tensor), 0), lambda: dist.send(host, self._peer(dst), group=self.group), to=dst)

    def recv(self, tensor: torch.Tensor, src: int, tag: str) -> torch.Tensor:
        host = self._host(tensor)
        self._timed(tag, Traffic(0, _nbytes(tensor)), lambda: dist.recv(host, self._peer(src), group=self.group), to=src)
        _back(host, tensor)
        return tensor

    def exchange(self, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor], tag: str) -> None:
        """Send to and receive from several peers at once (a neighbour exchange) and wait."""
        self.exchange_async(sends, recvs, tag).wait()

    def exchange_async(self, sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor], tag: str) -> Pending:
        """Post the sends and receives and return at once; `wait()` on the result before reading `recvs`.

        Bytes are counted when posted; the seconds counted are those spent blocked in `wait()`.
        """
        hosts = {p: self._host(t) for p, t in recvs.items()}
        ops = [dist.P2POp(dist.isend, self._host(t.contiguous()), self._peer(p), self.group) for p, t in sends.items()]
        ops += [dist.P2POp(dist.irecv, hosts[p], self._peer(p), self.group) for p in recvs]
        ready = self.ledger.count(tag, sum(_nbytes(t) for t in sends.values()), sum(_nbytes(t) for t in recvs.values()),
                                  wire=max((_nbytes(t) for t in sends.values()), default=0),  # one link per peer, in parallel
                                  inter=sum(_nbytes(t) for p, t in sends.items() if self.crosses(p)),
                                  links=[(p, _nbytes(t), self.crosses(p)) for p, t in sends.items()])
        staged = [(hosts[p], t) for p, t in recvs.items() if hosts[p] is not t]
        return Pending(self, tag, dist.batch_isend_irecv(ops) if ops else [], ready, staged)

    def exchange_sized_async(self, peers: list[int], parts: list[tuple[str, torch.Tensor]],
                             tag: str) -> tuple[dict[int, list[torch.Tensor]], list[Pending]]:
        """Send the same `parts` (tag, 1-d tensor) to every peer when their lengths differ per rank:
        first the lengths (one int64 each, under `tag`, waited for), then each part under its own tag.

        Each part arrives on the device its sent tensor is on (indices on the CPU, values on the GPU).
        Returns each peer's received parts, in order, and the exchanges in flight (wait on all)."""
        device = parts[0][1].device  # the lengths travel beside the first part
        header = torch.tensor([t.numel() for _, t in parts], dtype=torch.int64, device=device)
        lengths = {j: torch.zeros(len(parts), dtype=torch.int64, device=device) for j in peers}
        self.exchange({j: header for j in peers}, lengths, tag)
        received: dict[int, list[torch.Tensor]] = {j: [] for j in peers}
        works = []
        for i, (part_tag, t) in enumerate(parts):
            into = {j: torch.empty(int(n[i]), dtype=t.dtype, device=t.device) for j, n in lengths.items()}
            works.append(self.exchange_async({j: t for j in peers}, into, part_tag))
            for j in peers:
                received[j].append(into[j])
        return received, works

    def broadcast_bytes(self, data: bytes | None, src: int, tag: str = "control") -> bytes:
        """Broadcast a byte string (e.g. a path) from `src`; plain bytes, never pickle."""
        if self.world == 1:
            return data or b""
        data = data or b""
        length = torch.tensor([len(data) if self.rank == src else 0], dtype=torch.int64, device=self.device)
        self.broadcast(length, src, tag)
        buf = torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device)
        if self.rank == src:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return bytes(self.broadcast(buf, src, tag).cpu().numpy().tobytes())

    def all_gather_bytes(self, data: bytes, tag: str) -> list[bytes]:
        """Every rank's byte string (lengths may differ), in rank order: the lengths, then the payloads
        padded to the longest. Plain bytes, never pickle."""
        if self.world == 1:
            return [data]
        lengths = [int(t.item()) for t in self.all_gather(torch.tensor([len(data)], device=self.device), tag)]
        buf = torch.zeros(max(lengths), dtype=torch.uint8, device=self.device)
        if data:
            buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = self.all_gather(buf, tag)
        return [bytes(p[:n].cpu().numpy().tobytes()) for p, n in zip(parts, lengths, strict=True)]

    # ---- data parallel ----------------------------------------------------------------------
    def data_parallel(self, module: torch.nn.Module, tag: str = "grad", reducer=None) -> torch.nn.Module:
        """Wrap `module` in DDP whose gradient allreduce is counted under `tag`. `reducer`: an object
        whose `allreduce(tensor, tag)` sums over this communicator's ranks its own way (such as
        comm/hierarchy.py's Hierarchy), run to completion in the hook; None: the flat ring, overlapped
        with the backward pass.

        DDP's own initial broadcast and per-forward buffer broadcast would move uncounted bytes,
        so both are off here: we broadcast parameters and buffers ourselves (tag "init"), and
        the caller keeps buffers in step with `broadcast_buffers`.
        """
        if self.world == 1:
            return module
        from torch.nn.parallel import DistributedDataParallel

        self.broadcast_state(module, src=0, tag="init")
        ids = [self.device.index] if self.device.type == "cuda" else None
        with warnings.catch_warnings():  # broadcast_buffers=False is what keeps DDP from moving uncounted bytes
            warnings.simplefilter("ignore", FutureWarning)
            ddp = DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False, init_sync=False,
                                          process_group=self.group)
        if reducer is None:
            ddp.register_comm_hook((self, tag), _counted_allreduce_hook)
        else:
            ddp.register_comm_hook((self, reducer, tag), _reducer_hook)
        return ddp

    def settle_async(self, tag: str) -> None:
        """After backward: add the time spent waiting for the last async bucket (exposed comm)."""
        if self._launched_at is not None:
            self.ledger.add_time(tag, time.perf_counter() - self._launched_at)
            self._launched_at = None

    def broadcast_state(self, module: torch.nn.Module, src: int, tag: str, buffers_only: bool = False) -> None:
        """Make every rank's parameters (and floating buffers) equal to rank `src`'s.

        The whole state goes out only when needed: ranks seeded alike already hold the same
        initial weights, which an 8-byte fingerprint per rank shows (counted under `tag`)."""
        tensors: list[torch.Tensor] = [] if buffers_only else list(module.parameters())
        tensors += [b for b in module.buffers() if b.is_floating_point()]
        if self.world == 1 or (not buffers_only and self._same_everywhere(tensors, tag)):
            return
        with torch.no_grad():
            for t in tensors:
                self.broadcast(t.data, src, tag)

    def _same_everywhere(self, tensors: list[torch.Tensor], tag: str) -> bool:
        digest = hashlib.blake2b(digest_size=8)
        for t in tensors:
            digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        mine = torch.tensor([int.from_bytes(digest.digest(), "little", signed=True)], dtype=torch.int64,
                            device=self.device)
        return len({int(v.item()) for v in self.all_gather(mine, tag)}) == 1


class _Store(dist.Store):
    """A torch.distributed store that hands every call to a plain Python key-value object."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def add(self, key, amount):
        return self.inner.add(key, amount)

    def check(self, keys):
        return self.inner.check(keys)

    def wait(self, keys, timeout=None):
        self.inner.wait(keys, timeout)

    def delete_key(self, key):
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()


class Pending:
    """Point-to-point operations in flight."""

    def __init__(self, comm: Communicator, tag: str, works: list, ready_at: float = 0.0,
                 staged: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
        """`staged`: (host copy, the caller's CUDA tensor) pairs of receives staged through the host."""
        self.comm, self.tag, self.works, self.ready_at = comm, tag, works, ready_at
        self.staged = staged or []

    def wait(self) -> None:
        t0 = time.perf_counter()
        for work in self.works:
            work.wait()
        for host, tensor in self.staged:
            tensor.copy_(host)
        self.staged = []
        self.comm._sync()
        LinkModel.wait_until(self.ready_at)  # a modelled link: the bytes are still on the wire
        self.comm.ledger.add_time(self.tag, time.perf_counter() - t0)
        self.works = []


def _back(host: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy a received host copy back into `tensor` (nothing when no copy was made)."""
    if host is not tensor:
        tensor.copy_(host)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _counted_allreduce_hook(state, bucket):
    """DDP comm hook: the default mean-allreduce, with the ring-model bytes counted."""
    comm, tag = state
    buf = bucket.buffer()
    size = allreduce_traffic(_nbytes(buf), comm.world).sent
    inter = comm.crosses(comm._next())
    # a modelled link delays the allreduce's completion, not the backward pass
    ready = comm.ledger.count(tag, size, size, inter=size if inter else 0.0, links=[("ring", size, inter)])
    buf.div_(comm.world)
    comm._launched_at = time.perf_counter()
    fut = dist.all_reduce(buf, group=comm.group, async_op=True).get_future()
    if comm.link is None:
        return fut.then(lambda f: f.value()[0])
    return fut.then(lambda f: (LinkModel.wait_until(ready), f.value()[0])[1])


def _reducer_hook(state, bucket):  # no annotations: DDP checks a hook's return annotation, and ours are strings
    """DDP comm hook: the mean of the gradients by the caller's reducer, finished before it returns."""
    comm, reducer, tag = state
    buf = bucket.buffer()
    buf.div_(comm.world)
    reducer.allreduce(buf, tag)
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buf)
    return done
