"""What goes on the wire for a sparse exchange; every codec owns its exact wire size.

Index codecs turn a sorted index set into bytes and back:
  seed     nothing at all: the receiver derives the same indices from a shared seed and the step
  gaps     delta-encoded indices in the narrowest unsigned width (1, 2 or 4 bytes) that makes
           the payload smallest; a gap that does not fit is written as 0 followed by 8 bytes
           (the escape), so rare long gaps cost little. Header: width (1 byte) + count (8 bytes)
  bitmask  one bit per coordinate, ceil(d / 8) bytes
Values travel as raw float32. Payloads are uint8 tensors, so they go through the communicator
like any other tensor.
"""

from __future__ import annotations

import numpy as np
import torch

HEADER = 9  # gaps: width (uint8) + count (uint64)
ESCAPE = 8  # gaps: a long gap is 0 then the gap as uint64


class IndexCodec:
    name = "none"
    sends_indices = True

    def encode(self, indices: torch.Tensor, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def wire_bytes(self, payload: torch.Tensor) -> int:
        return payload.numel()


class SeedIndex(IndexCodec):
    name = "seed"
    sends_indices = False

    def encode(self, indices, numel):
        return torch.empty(0, dtype=torch.uint8)

    def decode(self, payload, numel):
        raise RuntimeError("seed mode sends no indices: derive them from the shared seed")


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

    @staticmethod
    def analytic_bytes(indices: torch.Tensor) -> int:
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


INDEX_CODECS = {"seed": SeedIndex, "gaps": GapsIndex, "bitmask": BitmaskIndex}
