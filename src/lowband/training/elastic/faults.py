"""Faults an elastic worker injects into itself, for tests (`LOWBAND_ELASTIC_FAULT`).

LOWBAND_ELASTIC_FAULT="ID:ROUND:WHERE:ACTION[:SECONDS],..." makes worker ID, in round ROUND, at WHERE
(inner: after its first inner step before that round; exchange: after the quorum formed, before the
collective; record: once it holds the claim to write epoch ROUND's record, before writing it; round:
after committing round ROUND as its source, before writing its line in quorums.jsonl) kill
itself (SIGKILL), stop itself (SIGSTOP) for SECONDS, start `lowband join RUN_DIR` and wait (up to
SECONDS) until the new worker is live, so that it arrives while the round is exchanging, or `fail`:
raise an error at WHERE in that round and every one after it (a cause that does not go away).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys

from lowband import procs
from lowband.comm.membership import Membership, wait_until


def fault_plan(worker: int) -> tuple[int, str, str, float] | None:
    """(round, where, action, seconds) of worker `worker`'s fault, or None."""
    spec = os.environ.get("LOWBAND_ELASTIC_FAULT", "")
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if int(parts[0]) == worker:
            return int(parts[1]), parts[2], parts[3], float(parts[4]) if len(parts) > 4 else 0.0
    return None


class Faults:
    """Worker `worker`'s planned fault, met at most once (a `fail` at every round from its own on)."""

    def __init__(self, worker: int, members: Membership, run_dir: str, log: logging.Logger):
        self.worker, self.members, self.run_dir, self.log = worker, members, run_dir, log
        self.plan = fault_plan(worker)
        self.joiner: subprocess.Popen | None = None  # a `lowband join` this worker started

    def maybe(self, round_no: int, where: str) -> None:
        """Meet the planned fault if it is due at `where` of round `round_no`."""
        plan = self.plan
        if plan is not None and plan[2] == "fail" and plan[0] <= round_no and plan[1] == where:
            raise RuntimeError(f"LOWBAND_ELASTIC_FAULT: an injected failure at round {round_no}")
        if plan is None or plan[0] != round_no or plan[1] != where:
            return
        self.plan = None
        self.log.warning(f"worker {self.worker}: LOWBAND_ELASTIC_FAULT: {plan[2]} at round {round_no} ({where})")
        if plan[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if plan[2] == "join":  # start `lowband join` and go on once the joiner is live: it comes mid-exchange
            self._join_now(plan[3] or 60.0)
            return
        procs.start(["sh", "-c", f"sleep {plan[3]}; kill -CONT {os.getpid()}"], tied=False,  # outlives the stop
                    start_new_session=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _join_now(self, timeout_s: float) -> None:
        before = self.members.live()
        self.joiner = procs.start([sys.executable, "-m", "lowband", "join", self.run_dir],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: True if self.members.live() - before else None, timeout_s, poll_s=0.1)

    def wait_for_joiner(self, timeout_s: float = 30.0) -> None:
        """A joiner this worker started dies with it: let it finish the job it joined first."""
        if self.joiner is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.joiner.wait(timeout=timeout_s)
