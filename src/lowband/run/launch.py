"""Start K local worker processes (the environment torchrun would give them) and supervise them.

Each worker is `python -m lowband.run.launch MODULE:FUNCTION ARGS...` with RANK, WORLD_SIZE,
LOCAL_RANK and a fresh rendezvous file in its environment, one thread, and a parent-death
signal, so no worker outlives its launcher. When one worker fails the others are stopped at
once (SIGTERM, then SIGKILL after a grace period) and the launcher returns the failure's code;
Ctrl-C stops every worker the same way.

How a worker starts: where it is safe, the launcher forks it (`fork_worker`): the child inherits the
imported torch and lowband and the entry's module, so a worker starts in milliseconds instead of the
seconds a fresh interpreter takes to import torch (on a 2-core machine, most of a short run). That is
safe on a CPU-only torch build with no network namespace; a CUDA build (a forked child cannot use a
CUDA driver its parent touched) or a shaped namespace (`ip netns exec`) starts each worker as a new
process, as torchrun does. LOWBAND_START=exec or fork chooses by hand. Either way a worker has the same
environment (RANK, ...), its name `lowband-rN` (/proc/PID/comm, `ps -o comm`) and the same exit codes.

A worker's own crash (any exception lowband did not raise on purpose, e.g. a gloo error after a peer
died or stopped answering) is written to RENDEZVOUS_DIR/crash.rank{R}.txt (the run directory: its
first line says what happened, the traceback follows), never to the console: the launcher reports
the failure once, in one line that names the cause and where each traceback is.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Sequence
from typing import NoReturn

from lowband.atomic import discard_pending, process_running
from lowband.errors import Diverged, Unavailable, UsageError

GRACE_S = 5.0
STOPPED_QUIETLY = "LOWBAND_STOPPED_QUIETLY"  # set by a caller that stops us on purpose (a pruned tuning trial)
CRASH_FILE = "crash.rank{rank}.txt"
# what a backend's error says when the cause is a peer: (words in its message, what lowband says)
PEER_FAILURES = (("timed out", "a collective with its peers timed out (a peer stopped answering, or is far "
                               "slower; train.timeout_s bounds the wait)"),
                 ("connection closed", "lost its connection to a peer"), ("connection reset", "lost its connection "
                                                                                            "to a peer"),
                 ("broken pipe", "lost its connection to a peer"))


def die_with_parent() -> None:  # a preexec_fn: runs in the child between fork and exec
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def name_process(name: str) -> None:
    """Set this process's name (/proc/PID/comm, at most 15 bytes): how `ps` and the tests tell workers apart."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def can_fork(net=None) -> bool:
    """Whether workers may be forked from this process (the module doc): LOWBAND_START says so, else
    a CPU-only torch build and no shaped namespace."""
    how = os.environ.get("LOWBAND_START", "")
    if how in ("exec", "fork"):
        return how == "fork" and net is None
    if net is not None or not hasattr(os, "fork"):
        return False
    import torch  # what the forked worker inherits; the launcher needs it for nothing else

    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


class ForkedWorker:
    """A worker forked from the launcher, with the part of subprocess.Popen's interface supervise uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Worker = subprocess.Popen | ForkedWorker


def _flush_everything() -> None:
    """Flush every buffered stream a forked child would otherwise write a second time."""
    for handler in list(logging.root.handlers) + [h for lg in logging.root.manager.loggerDict.values()
                                                  for h in getattr(lg, "handlers", [])]:
        with contextlib.suppress(Exception):
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def fork_worker(entry: str, args: list[str], env: dict) -> ForkedWorker:
    """Fork a worker that runs worker_main([entry, *args]) in environment `env`, and exits with its code.
    Signals are as a new process would have them: SIGINT raises KeyboardInterrupt unless ignored."""
    _flush_everything()
    pid = os.fork()
    if pid:
        return ForkedWorker(pid)
    code = 1
    try:  # the child: never returns into the launcher's code
        die_with_parent()
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        code = worker_main([entry, *args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - worker_main reports its own failures; this is the last guard
        code = 1
    finally:
        leave_now(code)


def worker_env(rank: int, world: int, init_file: str, threads: int = 1) -> dict:
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "LOWBAND_WORKER": "1", "LOWBAND_INIT_FILE": init_file,
            "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}


def import_what_workers_import() -> None:
    """Import, before forking, what every worker would otherwise import by itself: a worker's first
    optimizer imports torch._dynamo (torch.optim wraps its methods in dynamo's disable), about 1.5 s of
    CPU on a 2-core machine. Imported once here, W forked workers share it instead of each paying; it
    starts no thread, so forking after it stays safe."""
    import torch._dynamo  # noqa: F401


def spawn(entry: str, args: list[str], world: int, rendezvous_dir: str, threads: int = 1,
          net=None) -> list[Worker]:
    """Start the workers; `net` (a NetnsLinks) runs each in its own shaped network namespace."""
    os.makedirs(rendezvous_dir, exist_ok=True)
    remove_orphan_rendezvous(rendezvous_dir)
    init_file = os.path.join(os.path.abspath(rendezvous_dir), f".rendezvous-{os.getpid()}-{uuid.uuid4().hex}")
    if can_fork(net):
        importlib.import_module(entry.partition(":")[0])  # once here, inherited by every worker
        import_what_workers_import()
        return [fork_worker(entry, args, worker_env(r, world, init_file, threads)) for r in range(world)]
    cmd = [sys.executable, "-m", "lowband.run.launch", entry, *args]
    procs: list[Worker] = []
    for r in range(world):
        env = {**worker_env(r, world, init_file, threads), **(net.env(r) if net else {})}
        procs.append(subprocess.Popen((net.prefix(r) if net else []) + cmd, env=env, preexec_fn=die_with_parent))
    return procs


def remove_orphan_rendezvous(folder: str) -> None:
    """Remove the rendezvous files of launchers that were killed (SIGKILL leaves no time to clean up)."""
    for name in os.listdir(folder):
        pid = name.removeprefix(".rendezvous-").split("-")[0]
        if name.startswith(".rendezvous-") and pid.isdigit() and not process_running(int(pid)):
            _remove(os.path.join(folder, name))


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
        from lowband.comm.links import UNLIMITED, NetnsLinks  # lowband.comm imports torch: the launcher need not

        with NetnsLinks(world, netns, sites, intra or UNLIMITED) as net:
            return _restarting(entry, args, world, rendezvous_dir, threads, keep_going, net, max_restarts, restart_args)
    return _restarting(entry, args, world, rendezvous_dir, threads, keep_going, None, max_restarts, restart_args)


def _restarting(entry, args, world, rendezvous_dir, threads, keep_going, net, max_restarts, restart_args) -> int:
    attempt = 0
    while True:
        code = _run(entry, args if attempt == 0 else restart_args, world, rendezvous_dir, threads, keep_going, net)
        if code in (0, 2, 4, 130) or attempt >= max_restarts or restart_args is None:  # a restart cannot mend these
            return code
        attempt += 1
        print(f"lowband: restarting all {world} worker(s) from the latest checkpoint "
              f"(restart {attempt} of {max_restarts})", file=sys.stderr, flush=True)


def _run(entry, args, world, rendezvous_dir, threads, keep_going, net) -> int:
    previous = signal.signal(signal.SIGTERM, raise_interrupt)  # SIGTERM cleans up like Ctrl-C
    procs = spawn(entry, args, world, rendezvous_dir, threads, net)
    try:
        return supervise(procs, keep_going=keep_going, crash_dir=rendezvous_dir)
    except KeyboardInterrupt:
        stop(procs)
        if os.environ.get(STOPPED_QUIETLY) != "1":
            print("lowband: interrupted; stopped every worker", file=sys.stderr)
        return 130
    finally:
        stop(procs)
        signal.signal(signal.SIGTERM, previous)
        for f in os.listdir(rendezvous_dir):
            if f.startswith(".rendezvous-"):
                _remove(os.path.join(rendezvous_dir, f))


def raise_interrupt(*_):  # a signal handler: SIGTERM then cleans up like Ctrl-C
    raise KeyboardInterrupt


class Watch:
    """What a job's membership makes of its workers' exits: the supervisor's one policy.

    Fixed membership (`lowband train`): a failure stops every worker, or with `keep_going` the others
    carry on (a failure that every worker would meet, a usage error or a divergence, still stops them);
    the job is over when every worker has exited. An elastic job's watch (run/elastic_job.py) counts a
    worker killed by a signal as churn and ends when the coordinator says the job finished."""

    goes_on = "the others carry on without it"  # what the churn line ends with
    poll_s = 0.05

    def __init__(self, keep_going: bool = False):
        self.keep_going = keep_going

    def churn(self, code: int, codes: list[int | None]) -> bool:
        """Whether the job goes on after a worker exited with `code` (not 0), all codes being `codes`."""
        return self.keep_going and any(c in (None, 0) for c in codes) and not {2, 4} & set(codes)

    def done(self, procs: list[Worker], codes: list[int | None]) -> int | None:
        """The job's exit code once it is over, else None (asked every poll, after the exits are handled)."""
        if any(c is None for c in codes):
            return None
        failed = [c for c in codes if c]
        return _exit_code(failed[0]) if failed else 0  # with keep_going: the run still lost a worker


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
    if code not in (2, 3, 4):  # a usage error, a service gone, a divergence: the worker (or its starter) said it
        print(f"lowband: worker {rank} (pid {procs[rank].pid}) {_describe(code or 0)}"
              f"{crash_note(crash_dir, rank, since)}; stopped the other {others} running worker(s)"
              f"{others_note(crash_dir, rank, len(procs), since)}", file=sys.stderr)
    return _exit_code(code)


def crash_path(folder: str, rank: int) -> str:
    return os.path.join(folder, CRASH_FILE.format(rank=rank))


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


def record_crash(error: BaseException) -> None:
    """Write a worker's crash to its crash file (the module doc): what happened in lowband's words, when a
    peer caused it, then the traceback. Without a rendezvous file (not launched here) it goes to stderr."""
    import traceback

    text = "".join(traceback.format_exception(error))
    said = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:200]
    peer = next((words for key, words in PEER_FAILURES if key in str(error).lower()), None)
    folder = os.path.dirname(os.environ.get("LOWBAND_INIT_FILE", ""))
    if not folder or not os.path.isdir(folder):
        sys.stderr.write(text)
        return
    with open(crash_path(folder, int(os.environ.get("RANK", "0"))), "w") as f:
        f.write(f"{peer or said}\n\n{text}")


def _failures(procs: list[Worker], churned: Collection[int] = ()) -> list[tuple[int, int]]:
    """(rank, exit status) of each worker that has ended in failure, but for the `churned` ones."""
    return [(r, c) for r, c in enumerate(p.poll() for p in procs) if c is not None and c != 0 and r not in churned]


KILLED = -signal.SIGKILL  # a Popen return code


def _cause(procs: list[Worker], poll_s: float, settle_s: float = 0.5, churned: Collection[int] = ()) -> tuple[int, int]:
    """The failure that explains the others: a worker's usage error (2) or divergence (4) before a
    peer's crash, which often follows from it (a collective cut short by the leaver). The peers get
    `settle_s` to show their codes, since the crash may be seen before the cause. Without one, the
    failure seen first: a peer that aborts after a worker was killed is not the cause. Workers `churned`
    earlier (lost while the job went on) are not candidates."""
    first = _failures(procs, churned)
    deadline, failed = time.monotonic() + settle_s, first
    while not any(c in (2, 4, KILLED) for _, c in failed) and time.monotonic() < deadline:
        time.sleep(poll_s)
        failed = _failures(procs, churned)
    explained = [f for f in failed if f[1] in (2, 4)]
    # a worker killed from outside (SIGKILL) explains its peers' crashes seen with it; a SIGABRT is how a
    # backend's crash ends, a consequence, not a cause
    killed = [f for f in failed if f[1] == KILLED]
    return min(explained, key=lambda f: (f[1] != 2, f[0])) if explained else (killed or first)[0]


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


def _exit_code(code: int | None) -> int:
    """A worker's exit status as the launcher's: 128 + N for a worker killed by signal N."""
    assert code is not None, "a worker still running has no exit code"
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def leave_now(code: int) -> NoReturn:
    """Exit at once with `code`, skipping interpreter teardown: a rank that leaves while its peers
    are mid-collective must not destroy its process group, which makes gloo abort (SIGABRT). A file it
    was writing is not left half-written beside its final name (atomic.discard_pending)."""
    discard_pending()
    logging.shutdown()
    with contextlib.suppress(Exception):  # a closed stream must not keep the process from leaving
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def worker_main(argv: list[str]) -> int:
    """Body of a worker process: call MODULE:FUNCTION(*ARGS), mapping failures to exit codes."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    name_process(f"lowband-r{os.environ.get('RANK', '0')}")
    module, _, func = argv[0].partition(":")
    try:
        getattr(importlib.import_module(module), func)(*argv[1:])
        return 0
    except (UsageError, Unavailable) as e:  # the launcher checks the config first, so this is rank-specific
        print(f"lowband: error: {e}", file=sys.stderr)
        return e.exit_code
    except Diverged as e:  # several ranks may diverge at once: the run's starter says it once (session.py)
        leave_now(e.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a crash: its file says why, the launcher says it once
        record_crash(e)
        leave_now(1)


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
