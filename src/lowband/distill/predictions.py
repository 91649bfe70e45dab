"""Prediction servers: codistillation's and AFSD's second exchange (AFSD paper, Fig. 1 and Section IV:
"each model uses the stale version of stored models on shared storage (or a prediction server)").

With the store, a model's whole checkpoint travels every N steps and every replica runs its peers'
models itself. With a prediction server, models never travel: the first rank of each model group runs
a `PredictionServer` (a thread in its worker, holding a copy of its model as of the last exchange,
refreshed every N steps, so staleness is the store's), and every step each replica sends its batch's
inputs to its peers' servers and gets back their logits (codistillation) or penultimate features
(AFSD): one forward of its own instead of K. Replicas send their inputs, not sample ids: with
`data = "partitioned"` replicas hold different samples, and a text window is not a stored sample.

What comes back goes through the method's value codec (fp32, fp16, bf16, int8), and logits may keep
only each row's k largest (`answer_topk`: their values and uint8/int16 indices; the rest read as
-inf, i.e. probability 0). Frames are `wire.py`'s (no pickle), the connection carries a token, the
server binds 127.0.0.1 unless told otherwise, and every socket has a timeout.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import secrets
import socket
import threading
import time
from typing import Any

import torch
from torch import nn

from lowband.comm.ledger import Tally, Traffic
from lowband.comm.value_codecs import Codec, parse_codec
from lowband.distill import wire
from lowband.distill.teacher import TeacherServer


class Features(nn.Module):
    """A model's penultimate features as its output: what an AFSD server answers."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model: Any = model  # a FeatureModel (models/base.py): features and head

    def forward(self, x):
        return self.model.features(x)


def index_dtype(classes: int) -> torch.dtype:
    """The smallest integer type that holds a class index."""
    return torch.uint8 if classes <= 256 else torch.int16 if classes <= 32768 else torch.int32


def encode_answer(out: torch.Tensor, codec: Codec, topk: int) -> tuple[list[torch.Tensor], dict]:
    """The tensors and header fields that carry `out` (n, ..., C): codec'd values, and with topk > 0
    only each row's k largest values and their indices."""
    meta: dict = {"shape": list(out.shape)}
    if 0 < topk < out.shape[-1]:
        values, index = out.topk(topk, dim=-1)
        meta["topk"] = topk
        return [codec.encode(values.flatten()), index.to(index_dtype(out.shape[-1]))], meta
    return [codec.encode(out.flatten())], meta


def decode_answer(frame: wire.Frame, codec: Codec) -> torch.Tensor:
    """`encode_answer`'s tensor back, as float32 (with topk: -inf outside each row's k largest)."""
    shape = [int(s) for s in frame.meta.get("shape", [])]
    topk = int(frame.meta.get("topk", 0))
    if not shape or any(s < 1 for s in shape) or len(frame.tensors) != (2 if topk else 1):
        raise wire.WireError(f"an answer must carry its shape and {2 if topk else 1} tensor(s)")
    if not topk:
        return codec.decode(frame.tensors[0], math.prod(shape)).reshape(shape)
    kept = [*shape[:-1], topk]
    values = codec.decode(frame.tensors[0], math.prod(kept)).reshape(kept)
    index = frame.tensors[1].long()
    if tuple(index.shape) != tuple(kept) or index.min() < 0 or index.max() >= shape[-1]:
        raise wire.WireError(f"top-k indices of shape {tuple(index.shape)} do not fit an answer of shape {shape}")
    return torch.full(shape, float("-inf")).scatter_(-1, index, values)


class PredictionServer(TeacherServer):
    """A teacher server whose model is replaced at every exchange (`publish`), and whose answers carry
    the version (the step) they were computed with. A request names the version it wants
    (`meta.version`, the asker's last exchange); the server waits up to `wait_s` for it (the store's
    lockstep), and answers with that version when it holds it, else with its newest. In lockstep it
    holds the previous version too: a peer a whole exchange behind still gets the model it asked for
    (a peer never runs further ahead, since its own questions wait for this one's next version)."""

    def __init__(self, model: nn.Module, in_shape, classes: int, *, features: bool = False, codec: str = "fp32",
                 topk: int = 0, site: int = 0, wait_s: float = 0.0, tokens: bool = False, **kw):
        """Serves a copy of `model`: its logits, or with `features` its penultimate features."""
        copies = [copy.deepcopy(model).requires_grad_(False) for _ in range(2 if wait_s > 0 else 1)]
        self.replicas = copies
        self.views = [Features(c) if features else c for c in copies]
        kw["token"] = kw.get("token") or secrets.token_hex(16)
        super().__init__(self.views[0], in_shape, classes, tokens=tokens, **kw)
        for view in self.views:
            view.to(self.device).eval()
        self.codec, self.topk, self.site, self.wait_s = parse_codec(codec, "method.codec"), topk, site, wait_s
        self.version, self.held = 0, {0: 0}  # version -> its slot in `replicas`
        self.fresh = threading.Condition(self._lock)
        self.moved = Tally()  # answers sent (sent), requests received (recv), answers across sites (inter)
        self.finished: set[int] = set()  # asker ranks that said they are done (`done` frames)
        self.last_ask = time.monotonic()

    def publish(self, version: int, state: dict) -> None:
        """Serve `state` (the model's state dict after step `version`) from now on."""
        with self.fresh:
            current = self.held[self.version]
            slot = (current + 1) % len(self.replicas)
            self.replicas[slot].load_state_dict(state)
            self.held = {self.version: current, version: slot} if len(self.replicas) > 1 else {version: slot}
            self.version, self.model = version, self.views[slot]
            self.fresh.notify_all()

    def answer(self, frame: wire.Frame, size: int) -> bytes:
        if frame.kind == "done":
            return self._done(frame)
        if frame.kind != "ask" or len(frame.tensors) != 1:
            raise wire.WireError(f"expected one 'ask' tensor, got {frame.kind!r} with {len(frame.tensors)}")
        x = frame.tensors[0]
        self.check(x)
        wanted = frame.meta.get("version", 0)
        if not isinstance(wanted, int):
            raise wire.WireError(f"version must be an integer, got {wanted!r}")
        with self.fresh:
            self.fresh.wait_for(lambda: self.version >= wanted, timeout=self.wait_s)
            version = wanted if wanted in self.held else self.version
            out = self.forward(x, self.views[self.held[version]])
        tensors, meta = encode_answer(out, self.codec, self.topk)
        return wire.encode("answer", frame.id, tensors, {**meta, "version": version})

    def _done(self, frame: wire.Frame) -> bytes:
        """An asker rank has finished training and will ask no more."""
        rank = frame.meta.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise wire.WireError(f"a done frame names its rank as an integer, got {rank!r}")
        with self.fresh:
            self.finished.add(rank)
            self.fresh.notify_all()
        return wire.encode("bye", frame.id)

    def linger(self, askers: set[int], idle_s: float) -> set[int]:
        """After this server's own model has finished: go on answering until every rank in `askers` has
        said it is done, or none has asked for `idle_s` seconds (a peer that died); the ranks that never
        said so."""
        with self.fresh:
            while not askers <= self.finished:
                left = idle_s - (time.monotonic() - self.last_ask)
                if left <= 0:
                    break
                self.fresh.wait(timeout=min(left, 0.5))
            return askers - self.finished

    def answered(self, frame: wire.Frame, request_bytes: int, reply_bytes: int) -> None:
        if frame.kind == "done":  # the asker counts the handshake, as control
            return
        self.last_ask = time.monotonic()
        crossed = frame.meta.get("site", self.site) != self.site
        self.moved.add(sent=reply_bytes, recv=request_bytes, inter=reply_bytes if crossed else 0)

    def take_bytes(self) -> Traffic:
        """Answers sent, requests received and answers sent across sites since the last call."""
        return self.moved.take()

    def address(self) -> dict:
        """What a replica needs to reach this server (the host it binds, unless that is every interface)."""
        host = socket.gethostbyname(socket.gethostname()) if self.host in ("0.0.0.0", "") else self.host
        return {"host": host, "port": self.port, "token": self.token}


class PredictionClient:
    """One replica's connection to one peer's prediction server. `ask` returns the answer and its version,
    or raises OSError / wire.WireError / TimeoutError; the caller decides what a failure costs."""

    def __init__(self, address: dict, codec: str, site: int, timeout_s: float):
        self.address, self.site, self.timeout_s = address, site, timeout_s
        self.codec = parse_codec(codec, "method.codec")
        self.sock: socket.socket | None = None
        self.limits = wire.Limits()
        self.seq = 0

    def connect(self) -> None:
        self.close()
        sock = socket.create_connection((self.address["host"], self.address["port"]), timeout=min(self.timeout_s, 5.0))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.timeout_s)
            wire.send(sock, wire.encode("hello", meta={"token": self.address["token"], "version": 1}))
            frame = self._recv(sock)[0]
            if frame.kind != "ready":
                raise ConnectionError(f"refused: {frame.meta.get('message', frame.kind)}")
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def ask(self, x: torch.Tensor, version: int) -> tuple[torch.Tensor, int, Traffic]:
        """(answer, its version, the bytes sent and received) for the inputs `x`, from the model as of
        `version` if the server holds it (else its newest)."""
        with self._closing_on_failure():
            frame, moved = self._request("ask", [x], {"version": version, "site": self.site}, "answer")
            return decode_answer(frame, self.codec), int(frame.meta.get("version", 0)), moved

    def done(self, rank: int) -> Traffic:
        """Tell the server that `rank` will ask no more (it keeps serving until its askers are done);
        the bytes sent and received. The connection is closed afterwards."""
        try:
            return self._request("done", [], {"rank": rank}, "bye")[1]
        finally:
            self.close()

    def _request(self, kind: str, tensors: list[torch.Tensor], meta: dict, reply: str) -> tuple[wire.Frame, Traffic]:
        """Send one frame (connecting first if needed) and read the server's `reply` frame to it:
        (that frame, the bytes sent and received). An error frame or any other reply raises
        ConnectionError, and any failure closes the connection."""
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        self.seq += 1
        request = wire.encode(kind, self.seq, tensors, meta)
        with self._closing_on_failure():
            wire.send(self.sock, request)
            frame, size = self._recv(self.sock)
            if frame.kind == "error":
                raise ConnectionError(frame.meta.get("message", "error"))
            if frame.kind != reply or frame.id != self.seq:
                raise ConnectionError(f"expected {reply} #{self.seq}, got {frame.kind!r} #{frame.id}")
            return frame, Traffic(len(request), size)

    @contextlib.contextmanager
    def _closing_on_failure(self):
        try:
            yield
        except BaseException:
            self.close()
            raise

    def _recv(self, sock: socket.socket) -> tuple[wire.Frame, int]:
        got = wire.recv(sock, self.limits)
        if got is None:
            raise ConnectionError("the server closed the connection")
        return got

    def close(self) -> None:
        if self.sock is not None:
            wire.hang_up(self.sock)
            self.sock = None


def encode_address(address: dict) -> bytes:
    return json.dumps(address).encode()


def decode_address(data: bytes) -> dict:
    """A server's address as `encode_address` wrote it ({} from a rank that serves nothing)."""
    return json.loads(data) if data else {}
