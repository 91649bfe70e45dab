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
  chunkB   exactly k indices in every chunk of C coordinates, each as its B-bit position in the
           chunk, B = ceil(log2 C), packed low bits first (chunk12: C = 4,096, two positions in three
           bytes): a size fixed by d alone, so a receiver sizes its buffer first
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
    return np.diff(indices.cpu().numpy().astype(np.int64), prepend=-1).astype(np.uint64)


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
        raw = payload.cpu().numpy().tobytes()
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
        bits[indices.cpu().numpy()] = True
        return torch.from_numpy(np.packbits(bits))

    def decode(self, payload, numel):
        return torch.from_numpy(np.unpackbits(payload.cpu().numpy(), count=numel).nonzero()[0].astype(np.int64))

    def payload_bytes(self, indices, numel):
        return math.ceil(numel / 8)


class ChunkIndex(IndexCodec):
    """Exactly `per_chunk` indices in every chunk of `chunk` coordinates (the last chunk counted whole),
    each sent as its position in the chunk in `bits` = ceil(log2 chunk) bits, packed low bits first;
    the count is padded to an even number, so 12-bit positions fill whole bytes (two in three)."""

    def __init__(self, per_chunk: int, chunk: int = CHUNK):
        self.chunk = chunk
        self.per_chunk = min(per_chunk, chunk)
        self.bits = max(1, math.ceil(math.log2(chunk)))
        self.name = f"chunk{self.bits}"

    def count(self, numel: int) -> int:
        """How many indices a vector of `numel` coordinates carries."""
        return math.ceil(numel / self.chunk) * self.per_chunk

    def payload_bytes(self, indices, numel):
        return _packed_bytes(self.count(numel), self.bits)

    def encode(self, indices, numel):
        return torch.from_numpy(_pack_positions((indices % self.chunk).cpu().numpy(), self.bits))

    def decode(self, payload, numel):
        positions = _unpack_positions(payload.cpu().numpy(), self.count(numel), self.bits)
        local = torch.from_numpy(positions).view(-1, self.per_chunk)
        start = torch.arange(local.shape[0], dtype=torch.int64).unsqueeze(1) * self.chunk
        return (local + start).reshape(-1)


def _packed_bytes(count: int, bits: int) -> int:
    """The length of `count` values of `bits` bits, the count padded to an even number."""
    return math.ceil((count + count % 2) * bits / 8)


def _pack_positions(positions: np.ndarray, bits: int) -> np.ndarray:
    """Values < 2**bits, each in `bits` bits, the first value in the lowest bits of the first byte."""
    padded = np.zeros(len(positions) + len(positions) % 2, np.int64)
    padded[:len(positions)] = positions
    grid = (padded[:, None] >> np.arange(bits)) & 1
    return np.packbits(grid.astype(np.uint8).reshape(-1), bitorder="little")


def _unpack_positions(packed: np.ndarray, count: int, bits: int) -> np.ndarray:
    flat = np.unpackbits(packed.astype(np.uint8), bitorder="little")[:(count + count % 2) * bits]
    grid = flat.reshape(-1, bits).astype(np.int64) << np.arange(bits)
    return grid.sum(axis=1)[:count]


INDEX_CODECS = {"seed": SeedIndex, "gaps": GapsIndex, "bitmask": BitmaskIndex}  # the sparsifiers' choices
