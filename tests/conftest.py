"""Shared fixtures: run the CLI in-process or as a real subprocess, and find a process tree.

Also the suite's rules: every test gets its layer's marker from its directory (tests/unit ->
`unit`, ...) and a time limit (pytest-timeout: 60 s in the unit layer, pyproject's default
elsewhere); with LOWBAND_STRICT_SKIPS=1 (CI) a skip not listed in tests/skip_allowlist.txt fails
the run.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("unit", "distributed", "contract", "faults")
UNIT_TIMEOUT_S = 60
ALLOWLIST = os.path.join(ROOT, "tests", "skip_allowlist.txt")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).split(os.sep)
        if parts[0] in LAYERS:
            item.add_marker(getattr(pytest.mark, parts[0]))
        if parts[0] == "unit" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))


def allowed_skips(path: str = ALLOWLIST) -> list[str]:
    """Node-id patterns (fnmatch) of tests that may skip; one a line, `#` starts a comment."""
    with open(path) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def unexpected_skips(nodeids: list[str], patterns: list[str]) -> list[str]:
    return [n for n in nodeids if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]


_skipped: list[tuple[str, str]] = []
_durations: dict[str, float] = {}  # nodeid -> seconds (setup, call and teardown), for LOWBAND_DURATIONS
_cpu: dict[str, float] = {}  # nodeid -> CPU seconds of the test's process and of the children it waited for
_cpu_at_start: dict[str, float] = {}
_warm_cpu_s = 0.0  # the CPU of the commands cli() ran warm (children of the server, not of this process)


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + _warm_cpu_s


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _cpu_at_start[item.nodeid] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown's report carries the CPU the test used (`cpu_s`): beside its wall time, how much it waited.
    It travels in user_properties, so that xdist's workers hand it to the process that writes the file."""
    outcome = yield
    if call.when == "teardown" and item.nodeid in _cpu_at_start:
        outcome.get_result().user_properties.append(("cpu_s", _cpu_seconds() - _cpu_at_start.pop(item.nodeid)))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason))
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown" and "cpu_s" in dict(report.user_properties):
        _cpu[report.nodeid] = dict(report.user_properties)["cpu_s"]


def write_durations(session) -> None:
    """Every test's wall seconds and CPU seconds into the JSON file LOWBAND_DURATIONS names (once, by the
    process that collects the workers' reports): `python benchmarks/suite_time.py FILE` says where the
    suite's time goes."""
    path = os.environ.get("LOWBAND_DURATIONS")
    if path and not hasattr(session.config, "workerinput"):
        import json

        with open(path, "w") as f:
            json.dump({"wall_s": _durations, "cpu_s": _cpu}, f, indent=0, sort_keys=True)


def pytest_sessionfinish(session, exitstatus):
    write_durations(session)
    if os.environ.get("LOWBAND_STRICT_SKIPS") != "1" or exitstatus not in (0, 1):
        return
    bad = unexpected_skips([n for n, _ in _skipped], allowed_skips())
    if bad:
        reasons = dict(_skipped)
        lines = [f"  {n}: {reasons[n]}" for n in bad]
        sys.stderr.write(f"\n{len(bad)} test(s) skipped that tests/skip_allowlist.txt does not allow:\n"
                         + "\n".join(lines) + "\n")
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test starts from the same environment: what one in-process command sets (LOWBAND_QUIET by
    `--quiet`, ...) must not reach the next test's processes, whichever order the tests run in."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True, scope="session")
def _env(tmp_path_factory):
    # workers must import the tests package, and every test shares one data cache (session-wide, so
    # that module-scoped fixtures can start runs too)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        mp.setenv("LOWBAND_TEST_CACHE", str(tmp_path_factory.getbasetemp().parent / "lowband-cache"))
        if os.environ.get("LOWBAND_TEST_COLD") != "1":
            from lowband.training import warm

            warm.prestart()  # cli()'s server, in the session's environment whatever a test later sets
        yield


CLI = "lowband.cli:main"


def start_entry(entry: str, argv: list[str], env: dict | None = None, stdio: tuple[int, int, int] = (0, 1, 2),
                cwd: str = ROOT):
    """ENTRY(ARGV) ('module:function' returning an exit code; CLI is `python -m lowband`) in a process of its
    own, forked from the warm-start server (lowband.training.warm, as a tuning trial is), which imported torch
    and lowband once: a fresh interpreter spends about 3.5 s of CPU importing them, most of a small run's
    cost. The process's exit code, output, files and signals are a fresh one's (tests/distributed/
    test_warm.py). With LOWBAND_TEST_COLD=1 every such process starts cold, in a fresh interpreter."""
    from lowband.training import warm

    if os.environ.get("LOWBAND_TEST_COLD") != "1":
        return warm.start(entry, argv, env, stdio, cwd)
    cmd = [sys.executable, "-m", "lowband", *argv] if entry == CLI else [
        sys.executable, "-m", "lowband.training.warm", "run", entry, *argv]
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2])


def cli(*args: str, timeout: float = 300, cwd: str = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m lowband ARGS` in a process of its own (start_entry); returns the finished process, its output
    captured."""
    with open(os.devnull) as devnull, tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        command = start_entry(CLI, list(args), env, (devnull.fileno(), out.fileno(), err.fileno()), cwd)
        try:
            code = command.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            command.kill()
            command.wait()
            raise
        finally:
            count_cpu(command)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["lowband", *args], code, out.read(), err.read())


class Output:
    """What a started process has printed to one file so far: `read()` the whole of it, `readline()` the next
    line (waiting for it while the process runs)."""

    def __init__(self, suffix: str):
        self.file = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False)  # noqa: SIM115 - closed on exit
        self.reader = open(self.file.name)  # noqa: SIM115 - its own offset, for readline

    def read(self) -> str:
        with open(self.file.name) as f:
            return f.read()

    def readline(self, timeout: float = 60) -> str:
        deadline, line = time.monotonic() + timeout, ""
        while not line.endswith("\n") and time.monotonic() < deadline:
            line += self.reader.readline()
            if not line.endswith("\n"):
                time.sleep(0.05)
        return line

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
            self.reader.close()
            os.unlink(self.file.name)


class Started:
    """A `python -m lowband` process that start_cli started and the test watches: Popen's pid, poll, wait,
    send_signal, terminate, kill and communicate, and `stdout` and `stderr` (Output: what it has printed so
    far; one file, `stdout`, when they are merged)."""

    def __init__(self, args: tuple[str, ...], cwd: str, env: dict | None, merged: bool):
        self.stdout = Output(".out")
        self.stderr = self.stdout if merged else Output(".err")
        with open(os.devnull) as devnull:
            stdio = (devnull.fileno(), self.stdout.file.fileno(), self.stderr.file.fileno())
            self.proc = start_entry(CLI, list(args), env, stdio, cwd)
        self.pid, self._counted = self.proc.pid, False

    def poll(self) -> int | None:
        return self._ended(self.proc.poll())

    def wait(self, timeout: float | None = None) -> int:
        return self._ended(self.proc.wait(timeout=timeout))

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr), once it has ended; ("", "") for stderr when the two were merged."""
        self.wait(timeout)
        return self.stdout.read(), "" if self.stderr is self.stdout else self.stderr.read()

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()

    def _ended(self, code: int | None) -> int | None:
        if code is not None and not self._counted:
            self._counted = True
            count_cpu(self.proc)
        return code

    def __del__(self):
        self.stdout.close()
        self.stderr.close()


def start_cli(*args: str, cwd: str = ROOT, env: dict | None = None, merged: bool = True) -> Started:
    """`python -m lowband ARGS` started, not waited for (start_entry, as cli() runs it); stdout and stderr in
    one file unless not `merged`."""
    return Started(args, cwd, env, merged)


def count_cpu(command) -> None:
    """A warm command is the server's child, not the test's: its CPU is added to the test's by hand (the
    durations file's CPU seconds; a cold one's is counted as this process's child once waited for)."""
    global _warm_cpu_s
    _warm_cpu_s += getattr(command, "cpu_s", None) or 0.0


def small(out, *extra: str) -> list[str]:
    """Arguments for a small, fast MNIST-1D run writing under `out`."""
    cache = os.environ["LOWBAND_TEST_CACHE"]
    return ["--samples", "600", "--batch-size", "16", "--set", f"data.cache_dir={cache!r}",
            "--set", "train.timeout_s=60", *extra]


def whole_and_resumed(tmp_path, args: list[str], stop: int, total: int):
    """Train `args` for `total` epochs in one go, and for `stop` epochs then resumed to `total`;
    returns the two run directories (every command asserted to succeed)."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert cli("train", *args, "--epochs", str(total), "--run-dir", str(whole)).returncode == 0
    assert cli("train", *args, "--epochs", str(stop), "--run-dir", str(split)).returncode == 0
    p = cli("train", "--resume", str(split), "--epochs", str(total))
    assert p.returncode == 0, p.stderr
    return whole, split


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def worker_rank(pid: int) -> int | None:
    """The rank of a lowband worker process (its name, /proc/PID/comm, is `lowband-rN`), else None."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return int(name.removeprefix("lowband-r")) if name.startswith("lowband-r") else None


def workers_of(pid: int) -> list[int]:
    """The lowband workers among `pid`'s children (forked or started as new processes)."""
    return [c for c in children(pid) if worker_rank(c) is not None]


def processes_naming(folder: str) -> list[int]:
    """Processes whose command line names `folder` (a launcher started for it, its forked workers, joiners)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll `predicate` every 0.1 s until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
