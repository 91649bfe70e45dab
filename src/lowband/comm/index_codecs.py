"""Index codecs: which coordinates a sparse message carries, as bytes; each knows its exact size.

Every top-k in lowband sends its positions through one of these (the sparsifiers of gossip and the
`topk:F` value codec of DiLoCo and local SGD, lowband.comm.value_codecs). An index codec turns a
sorted index set into a uint8 payload and back, and `payload_bytes(indices, numel)` is that
payload's length, computed without encoding:
  seed     nothing at all: the receiver derives the same indices from a shared seed and the step
  gaps     delta-encoded indices in the narrowest unsigned width (1, 2 or 4 bytes) that makes
           the payload smallest; a gap that does not fit is written as 0 followed by 8 bytes
           (the escape), so rare long gaps cost little. Header: width (1 byte) + count (8 bytes)
  bitmask  one bit per coordinate, ceil(d / 8) bytes
  chunk12  exactly k indices in every chunk of 4,096 coordinates, each as its 12-bit position in
           the chunk, two in three bytes: a size fixed by d alone, so a receiver sizes its buffer first
Payloads are uint8 tensors, so they go through the communicator like any other tensor.
"""

from __future__ import annotations

import math

import numpy as np
import torch

HEADER = 9  # gaps: width (uint8) + count (uint64)
ESCAPE = 8  # gaps: a long gap is 0 then the gap as uint64
CHUNK = 4096  # chunk12: positions inside a chunk fit in 12 bits


class IndexCodec:
    """Sorted int64 indices of coordinates 0..numel-1 <-> a uint8 payload."""

    name = "none"
    sends_indices = True

    def encode(self, indices: torch.Tensor, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def payload_bytes(self, indices: torch.Tensor | None, numel: int) -> int:
        """The length of `encode(indices, numel)`."""
        raise NotImplementedError


class SeedIndex(IndexCodec):
    name = "seed"
    sends_indices = False

    def encode(self, indices, numel):
        return torch.empty(0, dtype=torch.uint8)

    def decode(self, payload, numel):
        raise RuntimeError("seed mode sends no indices: derive them from the shared seed")

    def payload_bytes(self, indices, numel):
        return 0


def _gaps(indices: torch.Tensor) -> np.ndarray:
    """First gap index[0] + 1, then index[i] - index[i-1]: all >= 1 for sorted distinct indices."""
    return np.diff(indices.numpy().astype(np.int64), prepend=-1).astype(np.uint64)


class GapsIndex(IndexCodec):
    """Indices as gaps: the first is index + 1, then index[i] - index[i-1]; all gaps are >= 1."""

    name = "gaps"

    @staticmethod
    def best_width(gaps: np.ndarray) -> int:
        sizes = {w: len(gaps) * w + int((gaps >= (1 << (8 * w))).sum()) * ESCAPE for w in (1, 2, 4)}
        return min(sizes, key=lambda w: (sizes[w], w))

    def encode(self, indices, numel):
        gaps = _gaps(indices)
        width = self.best_width(gaps)
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
        long = gaps >= (1 << (8 * width))
        parts = [np.array([width], np.uint8).tobytes(), np.array([len(gaps)], np.uint64).tobytes()]
        if not long.any():
            parts.append(gaps.astype(dtype).tobytes())
        else:  # rare: write runs of short gaps, and each long gap as an escape
            for gap, is_long in zip(gaps, long, strict=True):
                parts.append((np.array([0], dtype).tobytes() + np.array([gap], np.uint64).tobytes()) if is_long
                             else np.array([gap], dtype).tobytes())
        return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)

    def decode(self, payload, numel):
        raw = payload.numpy().tobytes()
        width, count = raw[0], int(np.frombuffer(raw[1:HEADER], np.uint64)[0])
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
        body = raw[HEADER:]
        if len(body) == count * width:
            gaps = np.frombuffer(body, dtype).astype(np.int64)
        else:
            gaps, pos = np.empty(count, np.int64), 0
            for i in range(count):
                value = int(np.frombuffer(body[pos:pos + width], dtype)[0])
                pos += width
                if value == 0:
                    value = int(np.frombuffer(body[pos:pos + ESCAPE], np.uint64)[0])
                    pos += ESCAPE
                gaps[i] = value
        return torch.from_numpy(np.cumsum(gaps) - 1)

    def payload_bytes(self, indices, numel):
        assert indices is not None, "the gaps' size depends on the indices"
        gaps = _gaps(indices)
        width = GapsIndex.best_width(gaps)
        return HEADER + len(gaps) * width + int((gaps >= (1 << (8 * width))).sum()) * ESCAPE


class BitmaskIndex(IndexCodec):
    name = "bitmask"

    def encode(self, indices, numel):
        bits = np.zeros(numel, dtype=bool)
        bits[indices.numpy()] = True
        return torch.from_numpy(np.packbits(bits))

    def decode(self, payload, numel):
        return torch.from_numpy(np.unpackbits(payload.numpy(), count=numel).nonzero()[0].astype(np.int64))

    def payload_bytes(self, indices, numel):
        return math.ceil(numel / 8)


class ChunkIndex(IndexCodec):
    """Exactly `per_chunk` indices in every chunk of CHUNK coordinates (the last chunk counted whole),
    each sent as its 12-bit position in the chunk; two positions fill three bytes."""

    name = "chunk12"

    def __init__(self, per_chunk: int):
        self.per_chunk = min(per_chunk, CHUNK)

    def count(self, numel: int) -> int:
        """How many indices a vector of `numel` coordinates carries."""
        return math.ceil(numel / CHUNK) * self.per_chunk

    def payload_bytes(self, indices, numel):
        return 3 * math.ceil(self.count(numel) / 2)

    def encode(self, indices, numel):
        return torch.from_numpy(_pack12((indices % CHUNK).numpy()))

    def decode(self, payload, numel):
        local = torch.from_numpy(_unpack12(payload.cpu().numpy(), self.count(numel))).view(-1, self.per_chunk)
        start = torch.arange(local.shape[0], dtype=torch.int64).unsqueeze(1) * CHUNK
        return (local + start).reshape(-1)


def _pack12(positions: np.ndarray) -> np.ndarray:
    """Values < 4096, two in three bytes (an odd count is padded with a zero)."""
    idx = np.zeros(len(positions) + len(positions) % 2, np.uint16)
    idx[:len(positions)] = positions
    a, b = idx[0::2], idx[1::2]
    out = np.stack([a & 0xFF, (a >> 8) | ((b & 0xF) << 4), b >> 4], axis=1)
    return out.astype(np.uint8).reshape(-1)


def _unpack12(packed: np.ndarray, count: int) -> np.ndarray:
    trio = packed.reshape(-1, 3).astype(np.uint16)
    a = trio[:, 0] | ((trio[:, 1] & 0xF) << 8)
    b = (trio[:, 1] >> 4) | (trio[:, 2] << 4)
    return np.stack([a, b], axis=1).reshape(-1)[:count].astype(np.int64)


INDEX_CODECS = {"seed": SeedIndex, "gaps": GapsIndex, "bitmask": BitmaskIndex}  # the sparsifiers' choices
