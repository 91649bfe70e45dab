"""Shared fixtures: run the CLI in-process or as a real subprocess, and find a process tree."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    # workers must import the tests package, and every test shares one data cache
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cache = tmp_path_factory.getbasetemp().parent / "lowband-cache"
    monkeypatch.setenv("LOWBAND_TEST_CACHE", str(cache))


def cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run `python -m lowband ARGS` as a real process; returns the finished process."""
    return subprocess.run([sys.executable, "-m", "lowband", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.pop("cwd", ROOT), **kw)


def small(out, *extra: str) -> list[str]:
    """Arguments for a small, fast MNIST-1D run writing under `out`."""
    cache = os.environ["LOWBAND_TEST_CACHE"]
    return ["--samples", "600", "--batch-size", "16", "--set", f"data.cache_dir={cache!r}",
            "--set", "train.timeout_s=60", *extra]


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


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
