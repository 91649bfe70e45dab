"""EDL-Dist teacher server: answers inference requests (input batch -> logits) over TCP.

A teacher is any lowband model checkpoint. The server binds 127.0.0.1 unless told otherwise,
can require a shared token, and speaks the framing of `wire.py` only. A connection opens with
"hello" (carrying the token) and is answered "ready" with the model's input shape and class
count; then each "infer" frame (one float tensor of shape (n, *in_shape), n <= max_batch) gets a
"logits" frame with the same id. A malformed, oversized or unexpected frame gets an "error" frame,
the connection is closed, and the server goes on serving everyone else. Requests are computed
one at a time (one model, `threads` cores); `max_rate` caps samples/s, to share a machine or to
emulate a slower device. A connection that sends nothing for `idle_timeout_s` (or no hello
within `read_timeout_s`), or takes longer than `read_timeout_s` over one frame, is closed; past
`max_connections` open at once a new one gets an "error" frame and is closed. Tokens are compared
as UTF-8 bytes, in constant time.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time

import torch
from torch import nn

from lowband.distill import wire

log = logging.getLogger("lowband.teacher")


class RequestError(ValueError):
    """A well-framed request the teacher cannot answer (wrong shape, dtype, size)."""


class TeacherServer:
    def __init__(self, model: nn.Module, in_shape: tuple[int, ...], num_classes: int, *, host: str = "127.0.0.1",
                 port: int = 0, token: str | None = None, device: str = "cpu", max_batch: int = 4096,
                 max_rate: float = 0.0, limits: wire.Limits | None = None, name: str = "teacher",
                 idle_timeout_s: float = 300.0, read_timeout_s: float = 30.0, max_connections: int = 64,
                 tokens: bool = False):
        """`tokens`: the model reads int64 token ids below `num_classes` (a language model), not floats."""
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.in_shape, self.num_classes, self.name = tuple(in_shape), num_classes, name
        self.token, self.max_batch, self.max_rate, self.tokens = token, max_batch, max_rate, tokens
        item = 8 * max(1, int(torch.tensor(in_shape).prod()))
        self.limits = limits or wire.Limits(max_payload=max_batch * item + 1024)
        self.sock = socket.create_server((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self._lock, self._closed = threading.Lock(), False
        self._conns: set = set()
        self.served, self.rejected, self.samples = 0, 0, 0
        self._busy_until = 0.0
        self.idle_timeout_s, self.read_timeout_s, self.max_connections = idle_timeout_s, read_timeout_s, max_connections

    # ---- serving ------------------------------------------------------------------------------
    def start(self) -> TeacherServer:
        threading.Thread(target=self.serve_forever, name="teacher-accept", daemon=True).start()
        return self

    def serve_forever(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if len(self._conns) >= self.max_connections:
                self._refuse(conn, f"too many connections (at most {self.max_connections}); try again later")
                continue
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="teacher-conn", daemon=True).start()

    def _refuse(self, conn: socket.socket, why: str) -> None:
        self.rejected += 1
        log.warning(f"refused a connection: {why}")
        _try_send(conn, wire.encode("error", meta={"message": why}))
        conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._hello(conn)
            while True:
                got = wire.recv(conn, self.limits, self.idle_timeout_s, self.read_timeout_s)
                if got is None:
                    return
                reply = self.answer(*got)
                self.answered(got[0], got[1], len(reply))  # counted before the asker can hold it
                wire.send(conn, reply)
                self.served += 1
        except (wire.WireError, RequestError, PermissionError, TimeoutError) as e:
            self.rejected += 1
            log.warning(f"rejected a request and closed its connection: {e}")
            _try_send(conn, wire.encode("error", meta={"message": str(e)}))
        except OSError:  # the peer went away
            pass
        finally:
            self._conns.discard(conn)
            conn.close()

    def _hello(self, conn: socket.socket) -> None:
        got = wire.recv(conn, wire.Limits(max_payload=0, max_tensors=0), self.read_timeout_s, self.read_timeout_s)
        if got is None:
            raise OSError("closed before hello")
        frame, _ = got
        if frame.kind != "hello":
            raise RequestError(f"the first frame must be 'hello', got {frame.kind!r}")
        offered = frame.meta.get("token") or ""
        if self.token and not (isinstance(offered, str) and same_token(offered, self.token)):
            raise PermissionError("wrong or missing token")
        wire.send(conn, wire.encode("ready", meta={"in_shape": list(self.in_shape), "classes": self.num_classes,
                                                   "model": self.name, "max_batch": self.max_batch}))

    def answer(self, frame: wire.Frame, size: int) -> bytes:
        """The reply to one request frame of `size` bytes (the hello excepted)."""
        if frame.kind != "infer" or len(frame.tensors) != 1:
            raise RequestError(f"expected one 'infer' tensor, got {frame.kind!r} with {len(frame.tensors)}")
        return wire.encode("logits", frame.id, [self.infer(frame.tensors[0])])

    def answered(self, frame: wire.Frame, request_bytes: int, reply_bytes: int) -> None:
        """Called with each reply just before it is sent (a hook for servers that count their bytes): once an
        asker holds an answer, its bytes are counted, so a rank that takes its server's count after every
        asker's last answer (a barrier) misses none."""

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        self.check(x)
        with self._lock:
            return self.forward(x)

    def check(self, x: torch.Tensor) -> None:
        """Raise RequestError unless `x` is a batch this model reads."""
        kind = "an int64" if self.tokens else "a float"
        right_kind = (x.dtype == torch.int64) if self.tokens else x.is_floating_point()
        if not right_kind or tuple(x.shape[1:]) != self.in_shape or not 0 < len(x) <= self.max_batch:
            raise RequestError(f"expected {kind} tensor of shape (n, {', '.join(map(str, self.in_shape))}) with "
                               f"1 <= n <= {self.max_batch}; got {x.dtype} {tuple(x.shape)}")
        if self.tokens and (x.min() < 0 or x.max() >= self.num_classes):
            raise RequestError(f"token ids must lie in 0..{self.num_classes - 1}")

    @torch.no_grad()
    def forward(self, x: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        """The output of `model` (default: the served one) on a checked batch (the caller holds the lock)."""
        start, model = time.monotonic(), model or self.model
        out = model(x.to(self.device) if self.tokens else x.to(self.device, torch.float32)).float().cpu()
        self.samples += len(x)
        self._throttle(len(x), start)
        return out

    def _throttle(self, n: int, start: float) -> None:
        """With max_rate, a batch of n takes at least n / max_rate seconds, its compute included."""
        if self.max_rate <= 0:
            return
        self._busy_until = max(self._busy_until, start) + n / self.max_rate
        time.sleep(max(self._busy_until - time.monotonic(), 0.0))

    @torch.no_grad()
    def measure(self, batch: int = 64, seconds: float = 0.5) -> float:
        """Samples per second of this server's forward pass (with max_rate applied)."""
        x = (torch.randint(0, self.num_classes, (batch, *self.in_shape), device=self.device) if self.tokens
             else torch.randn(batch, *self.in_shape, device=self.device))
        self.model(x)  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.model(x)
            n += batch
        rate = n / (time.perf_counter() - t0)
        return min(rate, self.max_rate) if self.max_rate > 0 else rate

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        wire.hang_up(self.sock)
        for conn in list(self._conns):
            wire.hang_up(conn, close=False)  # its thread closes it


def same_token(offered: str, token: str) -> bool:
    """Constant-time comparison of two tokens as UTF-8 bytes (any characters allowed)."""
    return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass"))


def _try_send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(1.0)
        conn.sendall(data)
    except OSError:
        pass


def token_from_env(given: str | None) -> str | None:
    return given or os.environ.get("LOWBAND_TOKEN") or None
