"""Binary framing of tensors for the network: a header of plain types, then raw bytes. No pickle.

A frame is
    b"LBW1"  u32 header length (little endian)  header (UTF-8 JSON)  payload
and the header is {"kind": str, "id": int, "meta": {str: plain}, "tensors": [{"dtype", "shape"}]}.
The payload is the tensors' bytes, back to back, in C order. Everything a peer sends is checked
against `Limits` before any memory is allocated for it: the header's size and types, the dtype
(from a fixed list), the number of dimensions, and the payload's total size. Anything that does not
fit raises `WireError`; the server answering it closes the connection and keeps serving others.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from dataclasses import dataclass, field

import torch

MAGIC = b"LBW1"
PREFIX = struct.Struct("<4sI")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


class WireError(ValueError):
    """A frame that is malformed or exceeds the limits."""


@dataclass(frozen=True)
class Limits:
    max_header: int = 16 * 1024
    max_payload: int = 256 * 1024 * 1024
    max_tensors: int = 16
    max_dims: int = 8


@dataclass
class Frame:
    kind: str
    id: int = 0
    meta: dict = field(default_factory=dict)
    tensors: list[torch.Tensor] = field(default_factory=list)


def encode(kind: str, id: int = 0, tensors: list[torch.Tensor] = (), meta: dict | None = None) -> bytes:
    """The bytes of one frame."""
    parts, specs = [], []
    for t in tensors:
        if t.dtype not in NAMES:
            raise WireError(f"dtype {t.dtype} cannot be sent; allowed: {', '.join(DTYPES)}")
        t = t.detach().cpu().contiguous()
        specs.append({"dtype": NAMES[t.dtype], "shape": list(t.shape)})
        parts.append(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    header = json.dumps({"kind": kind, "id": int(id), "meta": meta or {}, "tensors": specs},
                        separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, len(header)) + header + b"".join(parts)


def header_length(prefix: bytes, limits: Limits) -> int:
    magic, n = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r} (not a lowband frame)")
    if n > limits.max_header:
        raise WireError(f"header of {n} bytes exceeds the limit of {limits.max_header}")
    return n


def parse_header(raw: bytes, limits: Limits) -> tuple[Frame, list[tuple[torch.dtype, list[int], int]]]:
    """The frame's plain fields and, per tensor, (dtype, shape, bytes); the payload size is checked."""
    try:
        h = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(f"header is not JSON ({e})") from None
    if not isinstance(h, dict) or set(h) != {"kind", "id", "meta", "tensors"}:
        raise WireError("header must hold exactly kind, id, meta, tensors")
    kind, fid, meta, specs = h["kind"], h["id"], h["meta"], h["tensors"]
    if not isinstance(kind, str) or type(fid) is not int or not isinstance(meta, dict) or not isinstance(specs, list):
        raise WireError("header fields have the wrong types")
    if len(specs) > limits.max_tensors:
        raise WireError(f"{len(specs)} tensors exceed the limit of {limits.max_tensors}")
    layout, total = [], 0
    for spec in specs:
        dtype, shape = _tensor_spec(spec, limits)
        size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        total += size
        if total > limits.max_payload:
            raise WireError(f"payload exceeds the limit of {limits.max_payload} bytes")
        layout.append((dtype, shape, size))
    return Frame(kind, fid, meta), layout


def _tensor_spec(spec, limits: Limits) -> tuple[torch.dtype, list[int]]:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape"}:
        raise WireError("a tensor spec must hold exactly dtype and shape")
    dtype, shape = spec["dtype"], spec["shape"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(f"dtype {dtype!r} is not allowed; allowed: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > limits.max_dims:
        raise WireError(f"shape must be a list of at most {limits.max_dims} sizes")
    if not all(type(s) is int and 0 <= s <= limits.max_payload for s in shape):
        raise WireError(f"shape {shape!r} holds a size that is not a non-negative integer within limits")
    return DTYPES[dtype], shape


def build(frame: Frame, layout, payload: bytes | bytearray) -> Frame:
    offset = 0
    for dtype, shape, size in layout:
        chunk = bytearray(payload[offset:offset + size])
        offset += size
        frame.tensors.append(torch.frombuffer(chunk, dtype=dtype).reshape(shape) if size else
                             torch.empty(shape, dtype=dtype))
    return frame


def decode(data: bytes, limits: Limits = Limits()) -> Frame:
    """The frame held exactly by `data`."""
    if len(data) < PREFIX.size:
        raise WireError("frame shorter than its prefix")
    n = header_length(data[:PREFIX.size], limits)
    if len(data) < PREFIX.size + n:
        raise WireError("frame shorter than its header")
    frame, layout = parse_header(data[PREFIX.size:PREFIX.size + n], limits)
    payload = data[PREFIX.size + n:]
    if len(payload) != sum(size for _, _, size in layout):
        raise WireError(f"payload holds {len(payload)} bytes; the header announces {sum(s for *_, s in layout)}")
    return build(frame, layout, payload)


def send(sock: socket.socket, data: bytes) -> int:
    sock.sendall(data)
    return len(data)


def recv(sock: socket.socket, limits: Limits = Limits()) -> tuple[Frame, int] | None:
    """The next frame on `sock` and its size in bytes; None when the peer closed cleanly between frames."""
    prefix = _read(sock, PREFIX.size, allow_eof=True)
    if prefix is None:
        return None
    n = header_length(prefix, limits)
    frame, layout = parse_header(_read(sock, n), limits)
    size = sum(s for *_, s in layout)
    return build(frame, layout, _read(sock, size)), PREFIX.size + n + size


def hang_up(sock: socket.socket, close: bool = True) -> None:
    """Shut `sock` down both ways (a thread blocked on it wakes up) and close it; never raises."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    if close:
        sock.close()


def _read(sock: socket.socket, n: int, allow_eof: bool = False) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if allow_eof and got == 0:
                return None
            raise ConnectionError(f"peer closed the connection inside a frame ({got} of {n} bytes)")
        got += k
    return buf
