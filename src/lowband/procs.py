"""Every process lowband starts, started here: commands (`start`, `run`) and forks (`fork`).

A child lowband starts dies with the process that started it (`tied`, PR_SET_PDEATHSIG), so a launcher
killed with SIGKILL leaves no worker, teacher, Redis or joiner behind; the exceptions say so where they
start (`tied=False`: a short command whose end is awaited, a detached helper in a session of its own).
How a started process is watched is run/launch.py's (`supervise`); how a worker runs, run/workers.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent dies (a preexec_fn: runs in the child between fork and exec)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(cmd: Sequence[str], *, tied: bool = True, **popen) -> subprocess.Popen:
    """`cmd` in a new process (subprocess.Popen's keywords: env, stdout, pass_fds, ...), dying with this one
    unless `tied` is False."""
    return subprocess.Popen(cmd, preexec_fn=die_with_parent if tied else None, **popen)


def run(cmd: Sequence[str], *, tied: bool = False, **keywords) -> subprocess.CompletedProcess:
    """`cmd` to its end (subprocess.run's keywords); `tied`: it dies with this process meanwhile."""
    return subprocess.run(cmd, preexec_fn=die_with_parent if tied else None, **keywords)


def fork() -> int:
    """os.fork(): the child's pid in the parent, 0 in the child (which must end with os._exit)."""
    return os.fork()


class Child:
    """A child known by its pid, with the part of subprocess.Popen's interface that lowband's watchers use
    (`poll`, `wait`, `send_signal`, `terminate`, `kill`): a forked worker (run/workers.py) and a command a
    warm server started (training/warm.py) say only how they learn their exit code (`poll`)."""

    pid: int

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
