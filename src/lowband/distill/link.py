"""One student-side connection to one teacher server, run by its own thread.

The thread keeps up to `depth` requests in flight (the next batch travels while the teacher
computes the previous one), takes work from the DistilReader and hands results back to it. Any
failure (connection refused or reset, an "error" frame, a reply out of order, no reply within
`timeout_s`) ends the link; the reader then re-sends whatever was in flight to other teachers.
"""

from __future__ import annotations

import socket
import threading
from collections import deque

from lowband.distill import wire
from lowband.distill.coordinator import TeacherInfo


class TeacherFailed(ConnectionError):
    pass


class TeacherLink:
    def __init__(self, reader, info: TeacherInfo, token: str | None, timeout_s: float, depth: int):
        self.reader, self.info, self.depth = reader, info, depth
        self.inflight: deque = deque()
        self.closed = False
        self.sock = socket.create_connection((info.host, info.port), timeout=min(timeout_s, 10.0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._handshake(token)
        except Exception:
            self.sock.close()
            raise
        self.sock.settimeout(timeout_s)
        self.thread = threading.Thread(target=self._run, name=f"teacher-{info.id}", daemon=True)

    def _handshake(self, token: str | None) -> None:
        self._send(wire.encode("hello", meta={"token": token or "", "version": 1}))
        frame = self._recv()
        if frame.kind != "ready":
            raise TeacherFailed(f"teacher {self.info.id} refused the connection: {frame.meta.get('message', frame.kind)}")
        want = (list(self.reader.in_shape), self.reader.num_classes)
        if (frame.meta.get("in_shape"), frame.meta.get("classes")) != want:
            raise TeacherFailed(f"teacher {self.info.id} serves inputs {frame.meta.get('in_shape')} -> "
                                f"{frame.meta.get('classes')} classes; the student needs {want[0]} -> {want[1]}")

    def start(self) -> TeacherLink:
        self.thread.start()
        return self

    def _send(self, data: bytes) -> None:
        wire.send(self.sock, data)
        self.reader.add_bytes(sent=len(data))

    def _recv(self) -> wire.Frame:
        got = wire.recv(self.sock, self.reader.limits)
        if got is None:
            raise TeacherFailed(f"teacher {self.info.id} closed the connection")
        frame, size = got
        self.reader.add_bytes(recv=size)
        return frame

    def _run(self) -> None:
        try:
            while not self.closed:
                item = self.reader.next_to_send(self) if len(self.inflight) < self.depth else None
                if item is not None:
                    self._send(wire.encode("infer", item.seq, [item.x]))
                elif self.inflight:
                    self._receive_one()
                else:
                    self.reader.wait_for_work()
        except (OSError, wire.WireError) as e:
            if not self.closed:
                self.reader.link_failed(self, e)

    def _receive_one(self) -> None:
        frame = self._recv()
        head = self.inflight[0]
        if frame.kind == "error":
            raise TeacherFailed(f"teacher {self.info.id} answered an error: {frame.meta.get('message')}")
        if frame.kind != "logits" or frame.id != head.seq or len(frame.tensors) != 1:
            raise TeacherFailed(f"teacher {self.info.id} sent {frame.kind!r} #{frame.id}; expected logits #{head.seq}")
        logits = frame.tensors[0]
        per_position = () if head.x.is_floating_point() else tuple(head.x.shape[1:])  # a language model's windows
        if tuple(logits.shape) != (len(head.x), *per_position, self.reader.num_classes):
            raise TeacherFailed(f"teacher {self.info.id} sent logits of shape {tuple(logits.shape)}")
        self.reader.deliver(self, logits)

    def close(self) -> None:
        self.closed = True
        wire.hang_up(self.sock)
