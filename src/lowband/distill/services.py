"""The processes EDL-Dist needs beside the student's workers, started and stopped around a run.

With `method.coordinator` empty and `method.local_teachers` = N > 0: an embedded Redis and N
`lowband teacher` processes on this machine. With a coordinator URL: it is checked (one-line error,
exit 2, when unreachable) and N local teachers, if asked for, register there. The URL reaches the
workers through the environment (LOWBAND_COORDINATOR), so config.toml never holds the port of a
Redis that is gone, and a restarted or resumed run gets a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from lowband import procs
from lowband.distill.coordinator import Coordinator, redact
from lowband.distill.redis_server import EmbeddedRedis
from lowband.errors import UsageError
from lowband.run.launch import stop

ENV = "LOWBAND_COORDINATOR"


@contextlib.contextmanager
def edl_services(cfg):
    """Context for one run of method `edl` with config `cfg` (an EDLConfig)."""
    if cfg.mode != "edl":
        yield
        return

    with contextlib.ExitStack() as stack:
        url = cfg.coordinator or os.environ.get(ENV, "")
        if url:
            Coordinator(url).ping()
        elif cfg.local_teachers:
            url = stack.enter_context(EmbeddedRedis())
            print(f"embedded Redis coordinator at {redact(url)}", flush=True)
        else:
            raise UsageError("method edl needs teachers: give --coordinator URL (where `lowband teacher` processes "
                             "register) or --local-teachers N (starts N here, with an embedded Redis)")
        if cfg.local_teachers:
            stack.enter_context(LocalTeachers(cfg.teacher, url, cfg.local_teachers, cfg.teacher_threads,
                                              cfg.teacher_max_rate))
        previous = os.environ.get(ENV)
        os.environ[ENV] = url
        try:
            yield
        finally:
            if previous is None:
                del os.environ[ENV]
            else:
                os.environ[ENV] = previous


class LocalTeachers:
    """N `lowband teacher` processes on this machine, each with a parent-death signal; stopped at the end."""

    def __init__(self, teacher: str, url: str, n: int, threads: int = 1, max_rate: float = 0.0):
        self.cmd = [sys.executable, "-m", "lowband", "teacher", "--checkpoint", teacher,
                    "--threads", str(threads), "--max-rate", str(max_rate)]
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                    ENV: url}  # the URL (its password) in the environment, not in the process list
        self.url, self.n = url, n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> LocalTeachers:
        for _ in range(self.n):
            self.procs.append(procs.start(self.cmd, env=self.env))
        try:
            self._wait_registered()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_registered(self, timeout_s: float = 120.0) -> None:
        coord, deadline = Coordinator(self.url), time.monotonic() + timeout_s
        while len(coord.teachers()) < self.n:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise UsageError(f"a local teacher exited with code {dead[0].returncode} before registering")
            if time.monotonic() > deadline:
                raise UsageError(f"local teachers did not register within {timeout_s:.0f} s")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        stop(self.procs)
