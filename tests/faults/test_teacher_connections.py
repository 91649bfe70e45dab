"""A teacher server under idle, slow, nested and numerous connections: each is closed, others served."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from torch import nn

from lowband.distill import wire
from lowband.distill.teacher import TeacherServer

IN, CLASSES = (8,), 5
pytestmark = pytest.mark.timeout(60)


def _server(**kw) -> TeacherServer:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(8, CLASSES))
    return TeacherServer(net, IN, CLASSES, **kw).start()


def _connect(server: TeacherServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _hello(server: TeacherServer, token: str = "") -> socket.socket:
    s = _connect(server)
    wire.send(s, wire.encode("hello", meta={"token": token}))
    frame, _ = wire.recv(s)
    assert frame.kind == "ready", frame.meta
    return s


def _ended(s: socket.socket) -> str:
    """'error: MESSAGE' or 'closed', once the server has ended the connection."""
    try:
        got = wire.recv(s)
    except OSError:
        return "closed"
    return "closed" if got is None else f"{got[0].kind}: {got[0].meta.get('message', '')}"


def _served(server: TeacherServer) -> bool:
    s = _hello(server)
    with s:
        wire.send(s, wire.encode("infer", 3, [torch.randn(2, 8)]))
        return wire.recv(s)[0].id == 3


def _wait_no_connections(server: TeacherServer, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while server._conns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server._conns


def test_idle_unauthenticated_connections_are_closed():
    server = _server(read_timeout_s=0.5, idle_timeout_s=0.5)
    try:
        idle = [_connect(server) for _ in range(10)]
        assert all(_ended(s).startswith("error: ") for s in idle)  # each told why, then closed
        _wait_no_connections(server)
        assert _served(server)
    finally:
        server.close()


def test_an_authenticated_connection_that_goes_quiet_is_closed():
    server = _server(read_timeout_s=5.0, idle_timeout_s=0.5)
    try:
        s = _hello(server)
        assert _ended(s).startswith("error: ")
        _wait_no_connections(server)
    finally:
        server.close()


def test_a_hello_sent_one_byte_at_a_time_is_cut_off():
    import select

    server = _server(read_timeout_s=0.5, idle_timeout_s=30.0)
    try:
        s = _connect(server)
        hello = wire.encode("hello", meta={"token": ""})
        for byte in hello:  # one byte every 0.1 s: about 5 s for the frame, past the 0.5 s allowed
            if select.select([s], [], [], 0)[0]:
                break  # the server has answered (or closed) before the hello was complete
            s.sendall(bytes([byte]))
            time.sleep(0.1)
        ended = _ended(s)  # the deadline may fire inside a read ("timed out") or between reads
        assert ended == "error: timed out" or "not complete in time" in ended, ended
        _wait_no_connections(server)
    finally:
        server.close()


def test_a_stalled_large_payload_is_dropped_with_its_buffer():
    server = _server(read_timeout_s=0.5, idle_timeout_s=30.0)
    try:
        s = _hello(server)
        frame = wire.encode("infer", 1, [torch.randn(4000, 8)])
        s.sendall(frame[:1000])  # announces 128 kB, sends a little, stalls
        assert _ended(s).startswith("error: ")
        _wait_no_connections(server)
        assert _served(server)
    finally:
        server.close()


def test_connections_past_the_cap_are_refused_with_an_error_frame():
    server = _server(max_connections=3, read_timeout_s=30.0, idle_timeout_s=30.0)
    try:
        held = [_hello(server) for _ in range(3)]
        extra = _connect(server)
        assert "too many connections" in _ended(extra)
        held[0].close()
        deadline = time.monotonic() + 10
        while len(server._conns) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _served(server)  # a slot came free
        for s in held[1:]:
            s.close()
    finally:
        server.close()


def test_deeply_nested_hello_gets_an_error_frame():
    server = _server()
    try:
        s = _connect(server)
        header = b'{"kind":"hello","id":0,"meta":{"token":' + b"[" * 5000 + b"]" * 5000 + b'},"tensors":[]}'
        s.sendall(wire.PREFIX.pack(wire.MAGIC, len(header)) + header)
        assert "nests deeper" in _ended(s)
        assert _served(server)
    finally:
        server.close()


def test_a_non_ascii_token_lets_in_exactly_its_holder():
    server = _server(token="s3crét")
    try:
        _hello(server, "s3crét").close()
        s = _connect(server)
        wire.send(s, wire.encode("hello", meta={"token": "s3cret"}))
        assert "wrong or missing token" in _ended(s)
    finally:
        server.close()
