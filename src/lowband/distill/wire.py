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

import contextlib
import json
import math
import socket
import struct
import time
from collections.abc import Sequence
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
    max_depth: int = 8  # nesting of the JSON header, checked before it is parsed


@dataclass
class Frame:
    kind: str
    id: int = 0
    meta: dict = field(default_factory=dict)
    tensors: list[torch.Tensor] = field(default_factory=list)


def encode(kind: str, id: int = 0, tensors: Sequence[torch.Tensor] = (), meta: dict | None = None) -> bytes:
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


def json_depth(raw: bytes | bytearray) -> int:
    """The deepest nesting of [ and { in JSON text, outside strings (no parsing, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in raw:
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = c == 0x5C, c != 0x22
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
    return deepest


def parse_header(raw: bytes, limits: Limits) -> tuple[Frame, list[tuple[torch.dtype, list[int], int]]]:
    """The frame's plain fields and, per tensor, (dtype, shape, bytes); the payload size is checked."""
    if json_depth(raw) > limits.max_depth:
        raise WireError(f"header nests deeper than {limits.max_depth} levels")
    try:
        h = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
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


def recv(sock: socket.socket, limits: Limits = Limits(), idle_s: float | None = None,
         frame_s: float | None = None) -> tuple[Frame, int] | None:
    """The next frame on `sock` and its size in bytes; None when the peer closed cleanly between frames.

    idle_s: how long to wait for a frame's first byte; frame_s: how long the rest of the frame may
    take once it has begun. Past either, TimeoutError (None: the socket's own timeout applies)."""
    if idle_s is not None:
        sock.settimeout(idle_s)
    first = _read(sock, 1, allow_eof=True)
    if first is None:
        return None
    deadline = None if frame_s is None else time.monotonic() + frame_s
    prefix = first + _need(sock, PREFIX.size - 1, deadline)
    n = header_length(prefix, limits)
    frame, layout = parse_header(bytes(_need(sock, n, deadline)), limits)
    size = sum(s for *_, s in layout)
    payload = _need(sock, size, deadline)
    return build(frame, layout, payload), PREFIX.size + n + size


def hang_up(sock: socket.socket, close: bool = True) -> None:
    """Shut `sock` down both ways (a thread blocked on it wakes up) and close it; never raises."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    if close:
        sock.close()


CHUNK = 1 << 20  # a buffer grows with what arrives, so a peer that announces much and stalls holds little


def _need(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    """Exactly n bytes (a peer closing inside a frame is an error, raised by _read)."""
    data = _read(sock, n, deadline=deadline)
    assert data is not None, "_read returns None only with allow_eof"
    return data


def _read(sock: socket.socket, n: int, allow_eof: bool = False, deadline: float | None = None) -> bytearray | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"frame not complete in time ({len(buf)} of {n} bytes)")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), CHUNK))
        if not chunk:
            if allow_eof and not buf:
                return None
            raise ConnectionError(f"peer closed the connection inside a frame ({len(buf)} of {n} bytes)")
        buf += chunk
    return buf
