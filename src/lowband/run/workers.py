"""A worker process of a run: how the launcher starts it, and what it runs.

Each worker is `python -m lowband.run.workers MODULE:FUNCTION ARGS...` with RANK, WORLD_SIZE,
LOCAL_RANK and a fresh rendezvous file in its environment, one thread, and a parent-death
signal, so no worker outlives its launcher (run/launch.py supervises them).

How a worker starts: where it is safe, the launcher forks it (`fork_worker`): the child inherits the
imported torch and lowband and the entry's module, so a worker starts in milliseconds instead of the
seconds a fresh interpreter takes to import torch (on a 2-core machine, most of a short run). That is
safe on a CPU-only torch build with no network namespace; a CUDA build (a forked child cannot use a
CUDA driver its parent touched) or a shaped namespace (`ip netns exec`) starts each worker as a new
process, as torchrun does. LOWBAND_START=exec or fork chooses by hand. Either way a worker has the same
environment (RANK, ...), its name `lowband-rN` (/proc/PID/comm, `ps -o comm`) and the same exit codes
(`worker_main`).

A worker's own crash (any exception lowband did not raise on purpose, e.g. a gloo error after a peer
died or stopped answering) is written to RENDEZVOUS_DIR/crash.rank{R}.txt (the run directory: its
first line says what happened, the traceback follows), never to the console: the launcher reports
the failure once, in one line that names the cause and where each traceback is.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import logging
import os
import signal
import subprocess
import sys
import uuid
from typing import NoReturn

from lowband.atomic import discard_pending, process_running
from lowband.errors import INTERRUPTED, TERMINATED, Diverged, Unavailable, UsageError
from lowband.procs import Child, die_with_parent, fork, start

CRASH_FILE = "crash.rank{rank}.txt"

# what a backend's error says when the cause is a peer: (words in its message, what lowband says)
PEER_FAILURES = (("timed out", "a collective with its peers timed out (a peer stopped answering, or is far "
                               "slower; train.timeout_s bounds the wait)"),
                 ("connection closed", "lost its connection to a peer"), ("connection reset", "lost its connection "
                                                                                            "to a peer"),
                 ("broken pipe", "lost its connection to a peer"))





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



class ForkedWorker(Child):
    """A worker forked from the launcher: its exit code from waitpid."""

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
    pid = fork()
    if pid:
        return ForkedWorker(pid)
    code = 1
    try:  # the child: never returns into the launcher's code
        die_with_parent()
        as_a_new_process()
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



def as_a_new_process() -> None:
    """Signals in a forked child as a process started anew has them: none blocked (a mask is inherited from
    the forking thread), and the launcher's own handlers (SIGTERM's clean-up, a test runner's alarms) gone,
    so SIGTERM ends the worker through its own handler (worker_main) whatever the parent was doing."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)



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
        gc.freeze()  # the launcher's objects out of the collector's reach: a worker's collections no longer
        #              write to (and so copy) every page the fork shares with it
        return [fork_worker(entry, args, worker_env(r, world, init_file, threads)) for r in range(world)]
    cmd = [sys.executable, "-m", "lowband.run.workers", entry, *args]
    procs: list[Worker] = []
    for r in range(world):
        env = {**worker_env(r, world, init_file, threads), **(net.env(r) if net else {})}
        procs.append(start((net.prefix(r) if net else []) + cmd, env=env))
    return procs



def remove_orphan_rendezvous(folder: str) -> None:
    """Remove the rendezvous files of launchers that were killed (SIGKILL leaves no time to clean up)."""
    for name in os.listdir(folder):
        pid = name.removeprefix(".rendezvous-").split("-")[0]
        if name.startswith(".rendezvous-") and pid.isdigit() and not process_running(int(pid)):
            remove_quietly(os.path.join(folder, name))



def crash_path(folder: str, rank: int) -> str:
    return os.path.join(folder, CRASH_FILE.format(rank=rank))



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



def say_once(line: str) -> None:
    """Print `line` from the first worker of the run to say anything (an O_EXCL marker beside the rendezvous
    file): every rank often meets the same cause (a full disk, a coordinator away), and one line is enough."""
    folder = os.path.dirname(os.environ.get("LOWBAND_INIT_FILE", ""))
    if folder and os.path.isdir(folder):
        try:
            os.close(os.open(os.path.join(folder, f".said-{os.getppid()}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        except OSError:
            pass
    print(line, file=sys.stderr, flush=True)



def remove_quietly(path: str) -> None:
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(TERMINATED))
    name_process(f"lowband-r{os.environ.get('RANK', '0')}")
    module, _, func = argv[0].partition(":")
    try:
        getattr(importlib.import_module(module), func)(*argv[1:])
        return 0
    except (UsageError, Unavailable) as e:  # found while training (a write the system refused, a service away)
        say_once(f"lowband: error: {e}")
        return e.exit_code
    except Diverged as e:  # several ranks may diverge at once: the run's starter says it once (session.py)
        leave_now(e.exit_code)
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - a crash: its file says why, the launcher says it once
        record_crash(e)
        leave_now(1)



if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))

