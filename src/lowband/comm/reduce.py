"""The mean of a vector over all ranks with every contribution on the wire encoded by a codec.

  fp32 (lossless)  one allreduce, as without compression
  dense codecs     a reduce-scatter then an all-gather, both encoded: rank j owns segment j, every
                   rank sends it its encoded segment j, j decodes and averages in float32, encodes
                   the mean once and sends it to every rank. Per rank 2 (K-1)/K of an encoded vector
                   goes out, as a ring allreduce of the encoded size would.
  sparse codecs    (topk) the encoded vectors are all-gathered and every rank decodes and averages
                   all K in float32: (K-1) encoded vectors per rank. With `by_senders`, each
                   coordinate's sum is divided by the number of messages holding a non-zero value
                   there (at least 1) instead of by K: a coordinate one worker sent is not diluted by
                   the K - 1 that did not.
A communicator without point-to-point calls (an elastic quorum's, comm.p2p False) takes the
sparse path for dense codecs too. Every rank ends with the same mean. The bytes are counted by the communicator under `tag`.
"""

from __future__ import annotations

from itertools import pairwise

import torch

from lowband.comm.value_codecs import Codec, ErrorFeedback


def _segments(numel: int, parts: int) -> list[tuple[int, int]]:
    bounds = [numel * i // parts for i in range(parts + 1)]
    return list(pairwise(bounds))


def _to_all(comm, payloads: dict[int, torch.Tensor], sizes: dict[int, int], tag: str) -> dict[int, torch.Tensor]:
    """Send payloads[j] to each rank j != me and receive sizes[j] bytes from each; returns what came in."""
    recvs = {j: torch.empty(n, dtype=torch.uint8, device=comm.device) for j, n in sizes.items()}
    comm.exchange({j: p.to(comm.device) for j, p in payloads.items()}, recvs, tag)
    return {j: r.cpu() for j, r in recvs.items()}


def _dense_mean(comm, x: torch.Tensor, codec: Codec, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    segs, me, peers = _segments(x.numel(), comm.world), comm.rank, [j for j in range(comm.world) if j != comm.rank]
    mine = [codec.encode(x[a:b]) for a, b in segs]
    sent = torch.cat([codec.decode(p, b - a) for p, (a, b) in zip(mine, segs, strict=True)])
    n_me = segs[me][1] - segs[me][0]
    got = _to_all(comm, {j: mine[j] for j in peers}, {j: codec.payload_bytes(n_me) for j in peers}, tag)
    total = codec.decode(mine[me], n_me)
    for j in peers:
        total += codec.decode(got[j], n_me)
    reduced = codec.encode(total / comm.world)
    back = _to_all(comm, {j: reduced for j in peers}, {j: codec.payload_bytes(segs[j][1] - segs[j][0]) for j in peers}, tag)
    back[me] = reduced
    mean = torch.cat([codec.decode(back[j], b - a) for j, (a, b) in enumerate(segs)])
    return mean, sent


def _sparse_mean(comm, x: torch.Tensor, codec: Codec, tag: str,
                 by_senders: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(the mean, what this rank sent, the mean number of messages holding each coordinate any holds)."""
    payload = codec.encode(x)
    parts = comm.all_gather(payload.to(comm.device), tag)
    decoded = torch.stack([codec.decode(p.cpu(), x.numel()) for p in parts])
    held = (decoded != 0).sum(dim=0)
    covered = int((held > 0).sum())
    senders = float(held.sum()) / covered if covered else 0.0
    total = decoded.sum(dim=0)
    mean = total / held.clamp(min=1) if by_senders else total / comm.world
    return mean, decoded[comm.rank], senders


def compressed_mean(comm, x: torch.Tensor, codec: Codec, tag: str,
                    feedback: ErrorFeedback | None = None, by_senders: bool = False) -> torch.Tensor:
    """The mean of flat float32 `x` over all ranks, each contribution sent through `codec`.

    With `feedback`, this rank sends codec(x + residual) and keeps the remainder for next time, and
    the feedback's flow records how many ranks sent each coordinate sent. `by_senders` divides a
    sparse codec's sums by those counts instead of by the ranks (module docstring). The result is on
    x's device; `x` is left alone.
    """
    if codec.lossless:
        return comm.allreduce(x.detach().clone(), tag=tag, mean=True)
    device, flat = x.device, x.detach().float().cpu()
    compensated = feedback.compensate(flat) if feedback else flat
    senders = float(comm.world)
    if comm.world == 1:
        mean = sent = codec.roundtrip(compensated)
    elif codec.sparse or not getattr(comm, "p2p", True):
        mean, sent, senders = _sparse_mean(comm, compensated, codec, tag, by_senders)
    else:
        mean, sent = _dense_mean(comm, compensated, codec, tag)
    if feedback:
        feedback.remember(compensated, sent, senders)
    return mean.to(device)
