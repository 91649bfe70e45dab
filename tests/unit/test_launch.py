"""The launcher's forked workers: each ends with the exit code a worker started anew would have."""

from __future__ import annotations

import os
import time

import pytest

from lowband.run import launch, workers


@pytest.mark.parametrize("what, code", [("ok", 0), ("usage", 2), ("unavailable", 3), ("interrupt", 130), ("crash", 1)])
def test_a_forked_worker_exits_with_its_ending_s_code(tmp_path, what, code):
    env = workers.worker_env(0, 1, str(tmp_path / ".rendezvous-x"))
    worker = workers.fork_worker("tests.distributed.helpers:ends_with", [what], env)
    assert worker.wait(timeout=30) == code and worker.poll() == code
    assert os.path.exists(tmp_path / "crash.rank0.txt") == (what == "crash")  # a crash is written down


def test_a_forked_worker_is_named_and_stopped_like_a_process(tmp_path):
    """Named lowband-r0 (what `ps` and the fault tests see), and stop() ends it through SIGTERM (exit 143)."""
    from tests.conftest import worker_rank

    env = workers.worker_env(0, 1, str(tmp_path / ".rendezvous-x"))
    sleeper = workers.fork_worker("tests.distributed.helpers:sleep_for", ["30"], env)
    deadline = time.monotonic() + 20
    while worker_rank(sleeper.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker_rank(sleeper.pid) == 0
    launch.stop([sleeper], grace_s=30)  # the exit path, not its speed: a loaded machine may take seconds
    assert sleeper.poll() == 143
