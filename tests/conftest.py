"""Shared fixtures: run the CLI in-process or as a real subprocess, and find a process tree.

Also the suite's rules: every test gets its layer's marker from its directory (tests/unit ->
`unit`, ...) and a time limit (pytest-timeout: 60 s in the unit layer, pyproject's default
elsewhere); with LOWBAND_STRICT_SKIPS=1 (CI) a skip not listed in tests/skip_allowlist.txt fails
the run.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
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


def _cpu_seconds() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


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
        yield


def cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run `python -m lowband ARGS` as a real process; returns the finished process."""
    return subprocess.run([sys.executable, "-m", "lowband", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", ROOT), **kw)


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
