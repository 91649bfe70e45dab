"""Value codecs: what a dense float32 vector becomes on the wire, each with its exact size.

A codec spec is one or two parts joined by "+":
  fp32                  raw float32 (4 bytes per value); the default, lossless
  fp16, bf16            half precision (2 bytes per value)
  int8, int4, int2      symmetric integers with one float32 scale per chunk of 1024 values
                        (scale = max |x| / (2^(b-1) - 1)); ":stochastic" rounds up with probability
                        equal to the remainder (unbiased), ":nearest" (default) to the nearest level
  lut1, lut2, lut4      b-bit codes into a table of 2^b levels per chunk of 1024 values: bins cut at the
                        chunk's quantiles, each decoded to its bin's mean (float32 in the payload); every
                        bin's sum survives exactly (SparseLoCo's 2-bit values)
  topk:F                per chunk of 4096 values, the round(F * 4096) largest in magnitude, their
                        positions through the chunk12 index codec (lowband.comm.index_codecs: 12 bits
                        each, two in three bytes); the values in fp32 or in the value codec after "+"
                        (topk:0.02+int2)
What travels, one way for every kind: values (here), indices (index_codecs.py) and checkpoints
(store.py) encode to bytes and decode back, and the bytes counted are the payload's length.
Every value payload is a uint8 tensor whose length, `payload_bytes(n)`, depends only on the
vector's length n, so receivers can size their buffers in advance. `ErrorFeedback` keeps what compression dropped and adds it to
the next vector (sent + residual = input + previous residual, exactly).
Same idea as hivemind's compression/ and torchft's quantization.py; our own code.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from lowband.comm.index_codecs import CHUNK, ChunkIndex
from lowband.errors import require

QUANT_CHUNK = 1024
TOPK_CHUNK = CHUNK  # 12-bit positions (lowband.comm.index_codecs.ChunkIndex)


def _view(payload: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes read as `dtype` (a copy: a slice may start at an offset the view cannot take)."""
    return payload.cpu().clone().view(dtype)


class Codec:
    """Encode a flat float32 vector into a uint8 payload of `payload_bytes(n)` bytes, and back."""

    spec = "fp32"
    sparse = False  # True: payloads cannot be summed chunk-wise; they are all-gathered

    @property
    def lossless(self) -> bool:
        return self.spec == "fp32"

    def payload_bytes(self, numel: int) -> int:
        return 4 * numel

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().float().contiguous().view(torch.uint8).clone()

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        return _view(payload, torch.float32)[:numel]

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """What the receiver reads when `x` is sent."""
        return self.decode(self.encode(x), x.numel())

    def state_dict(self) -> dict:
        """What a resumed run needs to encode as this one would have (a stochastic codec's random state)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back `state_dict()`'s output; a state saved without it (an older checkpoint) is ignored."""


class Half(Codec):
    def __init__(self, dtype: torch.dtype):
        self.dtype, self.spec = dtype, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]

    def payload_bytes(self, numel):
        return 2 * numel

    def encode(self, x):
        return x.detach().to(self.dtype).contiguous().view(torch.uint8).clone()

    def decode(self, payload, numel):
        return _view(payload, self.dtype)[:numel].float()


def _pack_bits(levels: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned levels < 2**bits, 8 // bits per byte, first value in the lowest bits."""
    per = 8 // bits
    padded = np.zeros(math.ceil(len(levels) / per) * per, np.uint8)
    padded[:len(levels)] = levels
    grid = padded.reshape(-1, per).astype(np.uint16) << (np.arange(per, dtype=np.uint16) * bits)
    return grid.sum(axis=1).astype(np.uint8)


def _unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    per = 8 // bits
    shifts = np.arange(per, dtype=np.uint8) * bits
    return ((packed[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]


class Quantized(Codec):
    """b-bit symmetric integers, one float32 scale per QUANT_CHUNK values."""

    def __init__(self, bits: int, stochastic: bool = False, seed: int = 0):
        self.bits, self.stochastic = bits, stochastic
        self.top = (1 << (bits - 1)) - 1  # levels -top..top, stored as 0..2*top
        self.spec = f"int{bits}" + (":stochastic" if stochastic else "")
        self.gen = torch.Generator().manual_seed(seed)

    def payload_bytes(self, numel):
        return 4 * math.ceil(numel / QUANT_CHUNK) + math.ceil(numel * self.bits / 8)

    def state_dict(self) -> dict:
        return {"rng": self.gen.get_state()} if self.stochastic else {}

    def load_state_dict(self, state: dict) -> None:
        if self.stochastic and "rng" in state:
            self.gen.set_state(state["rng"])

    def encode(self, x):
        levels, scale = quantize_chunks(x, self.top, self.gen if self.stochastic else None)
        packed = _pack_bits((levels + self.top).to(torch.uint8).numpy(), self.bits)
        return torch.cat([scale.contiguous().view(torch.uint8), torch.from_numpy(packed)])

    def decode(self, payload, numel):
        n_chunks = math.ceil(numel / QUANT_CHUNK)
        scale = _view(payload[:4 * n_chunks], torch.float32)
        levels = _unpack_bits(payload[4 * n_chunks:].cpu().numpy(), self.bits, numel)
        return dequantize_chunks(torch.from_numpy(levels.astype(np.float32)) - self.top, scale)


def quantize_chunks(x: torch.Tensor, top: int, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` (any shape, read in C order) as integer levels in -top..top (a flat float tensor of
    x.numel()) and one float32 scale, max |x| / top, per QUANT_CHUNK consecutive values. Rounds to
    nearest, or with `gen` stochastically (up with probability equal to the fraction)."""
    n = x.numel()
    padded = torch.zeros(math.ceil(n / QUANT_CHUNK) * QUANT_CHUNK)
    padded[:n] = x.detach().float().cpu().reshape(-1)
    chunks = padded.view(-1, QUANT_CHUNK)
    scale = chunks.abs().amax(dim=1, keepdim=True) / top
    scaled = chunks / torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.floor(scaled + torch.rand(scaled.shape, generator=gen)) if gen is not None else torch.round(scaled)
    return q.clamp(-top, top).reshape(-1)[:n], scale.reshape(-1)


def dequantize_chunks(levels: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Flat float32 values from `quantize_chunks`' levels (any shape) and scales."""
    flat = levels.float().reshape(-1)
    return flat * scale.repeat_interleave(QUANT_CHUNK)[:flat.numel()]


class Binned(Codec):
    """b-bit codes into a table of 2^b levels per QUANT_CHUNK values: the chunk's values are cut at
    their quantiles into 2^b bins of (nearly) equal count, each value sent as its bin's code, and each
    bin decoded to the mean of its values (sent as float32). Every bin's sum is kept exactly, so the
    chunk's sum is too; suited to the few large values a top-k keeps (SparseLoCo's 2-bit values)."""

    def __init__(self, bits: int):
        self.bits, self.levels, self.spec = bits, 1 << bits, f"lut{bits}"

    def payload_bytes(self, numel):
        return 4 * self.levels * math.ceil(numel / QUANT_CHUNK) + math.ceil(numel * self.bits / 8)

    def encode(self, x):
        codes, table = bin_chunks(x, self.levels)
        packed = _pack_bits(codes.to(torch.uint8).numpy(), self.bits)
        return torch.cat([table.reshape(-1).contiguous().view(torch.uint8), torch.from_numpy(packed)])

    def decode(self, payload, numel):
        n_table = self.levels * math.ceil(numel / QUANT_CHUNK)
        table = _view(payload[:4 * n_table], torch.float32).view(-1, self.levels)
        codes = torch.from_numpy(_unpack_bits(payload[4 * n_table:].cpu().numpy(), self.bits, numel).astype(np.int64))
        rows = torch.arange(numel) // QUANT_CHUNK
        return table[rows, codes]


def bin_chunks(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per QUANT_CHUNK consecutive values of flat `x`: each value's bin (its rank in the chunk times
    `levels` over the chunk's count, so bins hold equal shares) and each bin's mean (0 when empty).
    Returns codes (x.numel(),) and the table (chunks, levels), float32."""
    flat = x.detach().float().cpu().reshape(-1)
    n, rows = flat.numel(), math.ceil(flat.numel() / QUANT_CHUNK)
    padded = torch.full((rows * QUANT_CHUNK,), float("inf"))
    padded[:n] = flat
    ranks = padded.view(rows, QUANT_CHUNK).argsort(dim=1, stable=True).argsort(dim=1).reshape(-1)[:n]
    counts = torch.full((rows,), QUANT_CHUNK)
    counts[-1] = n - (rows - 1) * QUANT_CHUNK
    row = torch.arange(n) // QUANT_CHUNK
    codes = ranks * levels // counts[row]
    slot = row * levels + codes
    sums = torch.zeros(rows * levels).index_add_(0, slot, flat)
    sizes = torch.zeros(rows * levels).index_add_(0, slot, torch.ones(n))
    table = torch.where(sizes > 0, sums / sizes.clamp(min=1), torch.zeros_like(sums)).view(rows, levels)
    return codes, table


class TopKCodec(Codec):
    """Per chunk of `chunk` values (TOPK_CHUNK by default), the k largest in magnitude: their positions
    through the chunk index codec (lowband.comm.index_codecs.ChunkIndex), then the values through
    `values`."""

    sparse = True

    def __init__(self, fraction: float, values: Codec | None = None, chunk: int = TOPK_CHUNK):
        self.fraction, self.values, self.chunk = fraction, values or Codec(), chunk
        self.k = max(1, round(fraction * chunk))
        self.index = ChunkIndex(self.k, chunk)
        self.spec = f"topk:{fraction:g}" + ("" if self.values.spec == "fp32" else "+" + self.values.spec)

    def set_fraction(self, fraction: float) -> None:
        """Send `fraction` of each chunk from now on (a schedule's density: every rank sets the same)."""
        self.fraction, self.k = fraction, max(1, round(fraction * self.chunk))
        self.index = ChunkIndex(self.k, self.chunk)

    def state_dict(self) -> dict:
        return self.values.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.values.load_state_dict(state)

    def payload_bytes(self, numel):
        return self.index.payload_bytes(None, numel) + self.values.payload_bytes(self.index.count(numel))

    def encode(self, x):
        n = x.numel()
        padded = torch.zeros(math.ceil(n / self.chunk) * self.chunk)
        padded[:n] = x.detach().float().cpu()
        chunks = padded.view(-1, self.chunk)
        pos = chunks.abs().topk(self.index.per_chunk, dim=1, sorted=False).indices.sort(dim=1).values
        flat = (pos + torch.arange(chunks.shape[0]).unsqueeze(1) * self.chunk).reshape(-1)
        return torch.cat([self.index.encode(flat, n), self.values.encode(padded[flat])])

    def decode(self, payload, numel):
        head = self.index.payload_bytes(None, numel)
        flat = self.index.decode(payload[:head], numel)
        out = torch.zeros(math.ceil(numel / self.chunk) * self.chunk)
        out[flat] = self.values.decode(payload[head:], flat.numel())
        return out[:numel]


VALUE_SPECS = "fp32, fp16, bf16, int8, int4, int2 (optionally :stochastic or :nearest), lut1, lut2, lut4"
SPEC_HELP = f"{VALUE_SPECS}, or topk:F with 0 < F <= 1, optionally +VALUE (e.g. topk:0.02+int2)"
VALUE_PATTERN = r"fp32|fp16|bf16|lut[124]|int[248](?::(?:nearest|stochastic))?"  # a dense codec, as VALUE_SPECS says
DENSE = rf"\s*(?:{VALUE_PATTERN})\s*"  # a field that takes a dense codec only
SPEC = re.compile(rf"\s*(?:topk:(?P<fraction>[^+]*)(?:\+(?P<then>{VALUE_PATTERN}))?|(?P<value>{VALUE_PATTERN}))\s*")


def _value_codec(spec: str, seed: int) -> Codec:
    """The dense codec `spec` (it matches VALUE_PATTERN) names."""
    name, _, rounding = spec.partition(":")
    if name in ("fp16", "bf16"):
        return Half(torch.float16 if name == "fp16" else torch.bfloat16)
    if name.startswith("lut"):
        return Binned(int(name[3:]))
    return Quantized(int(name[3:]), rounding == "stochastic", seed) if name.startswith("int") else Codec()


def parse_codec(spec: str, field: str = "method.codec", seed: int = 0) -> Codec:
    """The codec a spec names (SPEC_HELP); a malformed spec raises ConfigError naming `field`."""
    m = SPEC.fullmatch(spec) if isinstance(spec, str) else None
    require(m is not None, field, spec, f"must be {SPEC_HELP}")
    assert m is not None
    if m["value"]:
        return _value_codec(m["value"], seed)
    try:
        f = float(m["fraction"])
    except ValueError:
        f = math.nan
    require(0 < f <= 1 and round(f * TOPK_CHUNK) >= 1, field, spec, f"topk:F needs 0 < F <= 1 keeping round(F x "
            f"{TOPK_CHUNK}) >= 1 values of each chunk (F >= 1/{TOPK_CHUNK} = {1 / TOPK_CHUNK:.3g}); {SPEC_HELP}")
    return TopKCodec(f, _value_codec(m["then"], seed) if m["then"] else None)


class ErrorFeedback:
    """Adds back what the codec dropped last time: send codec(x + decay·residual), keep the remainder.

    With decay 1 nothing is forgotten; SparseLoCo's decay below 1 makes the residual an exponential
    accumulator of past pseudo-gradients, which takes the place of the outer momentum. `decay` may be
    changed between calls (SparseLoCo's decay schedule). `flow` adds up, per call, where the buffer's
    mass went (L2 norms): the new input, what was sent, what the decay threw away, what stays; and
    `senders`, how many ranks' messages held each coordinate any message held (K for a dense codec;
    1 when the workers' top-k never overlap)."""

    FLOW = ("delta", "sent", "decayed", "kept", "senders")

    def __init__(self, codec: Codec, decay: float = 1.0):
        self.codec, self.decay = codec, decay
        self.residual: torch.Tensor | None = None
        self.flow = dict.fromkeys(("calls", *self.FLOW), 0.0)
        self._last: tuple[float, float] = (0.0, 0.0)  # (‖x‖, ‖decayed‖) of the call in progress

    def compensate(self, x: torch.Tensor) -> torch.Tensor:
        old = 0.0 if self.residual is None else float(self.residual.norm())
        self._last = (float(x.norm()), (1 - self.decay) * old)
        return x if self.residual is None else x + self.decay * self.residual.to(x.device)

    def remember(self, compensated: torch.Tensor, sent: torch.Tensor, senders: float = 1.0) -> None:
        self.residual = (compensated - sent.to(compensated.device)).detach().cpu()
        delta, decayed = self._last
        for key, value in (("calls", 1.0), ("delta", delta), ("sent", float(sent.norm())),
                           ("decayed", decayed), ("kept", float(self.residual.norm())), ("senders", senders)):
            self.flow[key] += value

    def take_flow(self) -> dict[str, float]:
        """The mean per call of each flow since the last take (empty when no call), and reset."""
        calls, flow = self.flow["calls"], self.flow
        self.flow = dict.fromkeys(flow, 0.0)
        return {k: flow[k] / calls for k in self.FLOW} if calls else {}

    def state_dict(self) -> dict:
        return {} if self.residual is None else {"residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        self.residual = state.get("residual")
