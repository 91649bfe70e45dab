"""Start K local worker processes (run/workers.py) and supervise them.

When one worker fails the others are stopped at once (SIGTERM, then SIGKILL after a grace period)
and the launcher returns the failure's code; Ctrl-C stops every worker the same way. A failure is
reported once, in one line that names the cause and where each crash file's traceback is
(run/workers.py writes them). `Watch` is the supervisor's policy: fixed membership here, churn in
an elastic job (training/elastic/job.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Sequence

from lowband.errors import BAD_INPUT, DIVERGED, INTERRUPTED, UNAVAILABLE, Terminated, raise_terminated
from lowband.run.workers import Worker, crash_path, remove_quietly, spawn

GRACE_S = 5.0

STOPPED_QUIETLY = "LOWBAND_STOPPED_QUIETLY"  # set by a caller that stops us on purpose (a pruned tuning trial)



def run(entry: str, args: list[str], world: int, rendezvous_dir: str, threads: int = 1,
        keep_going: bool = False, netns=None, max_restarts: int = 0, restart_args: list[str] | None = None,
        sites: list[int] | None = None, intra=None) -> int:
    """Run `entry` in `world` processes; return 0, or the first failing worker's exit code.

    max_restarts: when a worker fails, stop all and start all again with `restart_args` (which
    make them resume from the latest checkpoint), at most this many times, as torchrun does.
    A usage error (exit 2) or an interrupt is never retried.
    keep_going: a failed worker does not stop the others (for methods whose workers train
    separate models); once all have ended the first failure's code is returned all the same.
    netns: a LinkSpec; every worker then runs in its own namespace behind a shaped link, or with
    `sites` (each rank's site) in a site sharing one shaped uplink, `intra` (a LinkSpec) inside it.
    """
    if netns is not None:
        from lowband.net.links import UNLIMITED, NetnsLinks  # lowband.comm imports torch: the launcher need not

        with NetnsLinks(world, netns, sites, intra or UNLIMITED) as net:
            return _restarting(entry, args, world, rendezvous_dir, threads, keep_going, net, max_restarts, restart_args)
    return _restarting(entry, args, world, rendezvous_dir, threads, keep_going, None, max_restarts, restart_args)



#: exit codes a restart cannot mend: done, bad input, diverged, interrupted
FINAL = (0, BAD_INPUT, DIVERGED, INTERRUPTED)


def _restarting(entry, args, world, rendezvous_dir, threads, keep_going, net, max_restarts, restart_args) -> int:
    attempt = 0
    while True:
        code = _run(entry, args if attempt == 0 else restart_args, world, rendezvous_dir, threads, keep_going, net)
        if code in FINAL or attempt >= max_restarts or restart_args is None:
            return code
        attempt += 1
        print(f"lowband: restarting all {world} worker(s) from the latest checkpoint "
              f"(restart {attempt} of {max_restarts})", file=sys.stderr, flush=True)



def _run(entry, args, world, rendezvous_dir, threads, keep_going, net) -> int:
    previous = signal.signal(signal.SIGTERM, raise_terminated)  # SIGTERM cleans up like Ctrl-C
    procs = spawn(entry, args, world, rendezvous_dir, threads, net)
    try:
        return supervise(procs, keep_going=keep_going, crash_dir=rendezvous_dir)
    except KeyboardInterrupt as e:
        stop(procs)
        if isinstance(e, Terminated):
            raise  # `lowband` says "stopped by SIGTERM" (a pruned trial's caller: nothing)
        if os.environ.get(STOPPED_QUIETLY) != "1":
            print("lowband: interrupted; stopped every worker", file=sys.stderr)
        return INTERRUPTED
    finally:
        stop(procs)
        signal.signal(signal.SIGTERM, previous)
        for f in os.listdir(rendezvous_dir):
            if f.startswith((".rendezvous-", ".said-")):
                remove_quietly(os.path.join(rendezvous_dir, f))






class Watch:
    """What a job's membership makes of its workers' exits: the supervisor's one policy.

    Fixed membership (`lowband train`): a failure stops every worker, or with `keep_going` the others
    carry on (a failure that every worker would meet, a usage error or a divergence, still stops them);
    the job is over when every worker has exited. An elastic job's watch (training/elastic/job.py) counts a
    worker killed by a signal as churn and ends when the coordinator says the job finished; a tuning trial's
    (comparison/tuning.py) reads its epochs as they come and stops it when the pruner says so."""

    goes_on = "the others carry on without it"  # what the churn line ends with ('': no line)
    poll_s = 0.05

    def __init__(self, keep_going: bool = False):
        self.keep_going = keep_going

    def churn(self, code: int, codes: list[int | None]) -> bool:
        """Whether the job goes on after a worker exited with `code` (not 0), all codes being `codes`."""
        return self.keep_going and any(c in (None, 0) for c in codes) and not {BAD_INPUT, DIVERGED} & set(codes)

    def done(self, procs: list[Worker], codes: list[int | None]) -> int | None:
        """The job's exit code once it is over, else None (asked every poll, after the exits are handled)."""
        if any(c is None for c in codes):
            return None
        failed = [c for c in codes if c]
        return exit_code(failed[0]) if failed else 0  # with keep_going: the run still lost a worker



def supervise(procs: list[Worker], poll_s: float | None = None, keep_going: bool = False,
              crash_dir: str | None = None, watch: Watch | None = None) -> int:
    """Wait for the workers until `watch` (default: fixed membership, fail fast unless `keep_going`) says
    the job is over. A failure that is not churn stops the others and is reported in one line, with what
    the crash files in `crash_dir` say (see the module doc); churn is said once per worker."""
    watch = watch or Watch(keep_going)
    poll_s = watch.poll_s if poll_s is None else poll_s
    since = time.time()
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in [(r, c) for r, c in enumerate(codes) if c not in (None, 0) and r not in reported]:
            assert code is not None
            if not watch.churn(code, codes):
                return _stop_for(procs, poll_s, crash_dir, since, reported)
            reported.add(rank)
            if watch.goes_on:
                print(f"lowband: worker {rank} (pid {procs[rank].pid}) {_describe(code)}"
                      f"{crash_note(crash_dir, rank, since)}; {watch.goes_on}", file=sys.stderr, flush=True)
        code = watch.done(procs, codes)
        if code is not None:
            return code
        time.sleep(poll_s)



def _stop_for(procs: list[Worker], poll_s: float, crash_dir: str | None, since: float,
              churned: Collection[int] = ()) -> int:
    """Stop every worker for a failure; say which worker's exit caused it, once; its exit code. Workers
    already `churned` (lost earlier, the job went on) are not candidates for the cause."""
    rank, code = _cause(procs, poll_s, churned=churned)
    others = sum(p.poll() is None for p in procs)
    stop(procs)
    if code not in (BAD_INPUT, UNAVAILABLE, DIVERGED):  # the worker (or its starter) said it
        print(f"lowband: worker {rank} (pid {procs[rank].pid}) {_describe(code or 0)}"
              f"{crash_note(crash_dir, rank, since)}; stopped the other {others} running worker(s)"
              f"{others_note(crash_dir, rank, len(procs), since)}", file=sys.stderr)
    return exit_code(code)



def crash_note(folder: str | None, rank: int, since: float) -> str:
    """' (what its crash file says; traceback in PATH)' for a worker that wrote one after `since`, else ''."""
    path = crash_path(folder, rank) if folder else ""
    if not path or not os.path.isfile(path) or os.path.getmtime(path) < since:
        return ""
    with open(path, errors="replace") as f:
        first = f.readline().strip()
    return f" ({first}; traceback in {path})"



def others_note(folder: str | None, rank: int, world: int, since: float) -> str:
    """' (the errors this caused: PATHS)': the other workers' crash files written after `since`."""
    paths = [crash_path(folder, r) for r in range(world) if folder and r != rank]
    fresh = [p for p in paths if os.path.isfile(p) and os.path.getmtime(p) >= since]
    return f" (the errors this caused: {', '.join(fresh)})" if fresh else ""



def _failures(procs: list[Worker], churned: Collection[int] = ()) -> list[tuple[int, int]]:
    """(rank, exit status) of each worker that has ended in failure, but for the `churned` ones."""
    return [(r, c) for r, c in enumerate(p.poll() for p in procs) if c is not None and c != 0 and r not in churned]



KILLED = -signal.SIGKILL  # a Popen return code



def _cause(procs: list[Worker], poll_s: float, settle_s: float = 0.5, churned: Collection[int] = ()) -> tuple[int, int]:
    """The failure that explains the others: a worker's usage error or divergence before a
    peer's crash, which often follows from it (a collective cut short by the leaver). The peers get
    `settle_s` to show their codes, since the crash may be seen before the cause. Without one, the
    failure seen first: a peer that aborts after a worker was killed is not the cause. Workers `churned`
    earlier (lost while the job went on) are not candidates."""
    first = _failures(procs, churned)
    deadline, failed = time.monotonic() + settle_s, first
    while not any(c in (BAD_INPUT, DIVERGED, KILLED) for _, c in failed) and time.monotonic() < deadline:
        time.sleep(poll_s)
        failed = _failures(procs, churned)
    explained = [f for f in failed if f[1] in (BAD_INPUT, DIVERGED)]
    # a worker killed from outside (SIGKILL) explains its peers' crashes seen with it; a SIGABRT is how a
    # backend's crash ends, a consequence, not a cause
    killed = [f for f in failed if f[1] == KILLED]
    return min(explained, key=lambda f: (f[1] != BAD_INPUT, f[0])) if explained else (killed or first)[0]



def stop(procs: Sequence[Worker], grace_s: float = GRACE_S) -> None:
    """Terminate, then kill, every process still running; reap all of them."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()



def exit_code(code: int | None) -> int:
    """A worker's exit status as the launcher's: 128 + N for a worker killed by signal N."""
    assert code is not None, "a worker still running has no exit code"
    return 128 - code if code < 0 else code



def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"

