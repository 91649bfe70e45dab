"""Warm starts: run a lowband entry point (a tuning trial: lowband.training.session:run_prepared) in a
process forked from a server that has imported torch and lowband already, not in a fresh interpreter.

A tuning trial on a small model is mostly start-up. On a 2-core machine a 4-epoch MNIST-1D trial
trains for 0.6 s, and its process spends about 3.5 s of CPU importing torch, its dynamo (which every
optimizer imports on first use) and lowband. A search runs a dozen such trials.

The server (`python -m lowband.training.warm serve FD`) is a fresh interpreter, so it inherits no thread
and no state of the caller's. It imports PRELOAD once, runs no tensor operation, then forks one child
per command it is sent over a Unix socket. A command is JSON (the entry point 'module:function', its
arguments, the environment, the working directory, whether SIGINT is ignored) and the caller's
stdin, stdout and stderr as descriptors (SCM_RIGHTS), so a child prints where a subprocess of the
caller would. The server reports each child's pid; once it has reaped it, its exit code (negative
when a signal ended it, as subprocess gives it) and its CPU seconds, its workers' included. The
server dies with the caller and a child with the server (PR_SET_PDEATHSIG): no command outlives a
killed comparison. A server that cannot start leaves the command to start cold, with one warning.

Where workers may not be forked (workers.can_fork: a CUDA build of torch, whose driver a forked child
cannot use; LOWBAND_START=exec), a command starts cold: `python -m lowband.training.warm run ENTRY ARGV`.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys

from lowband import procs
from lowband.run.workers import can_fork, leave_now

PRELOAD = ["torch", "torch._dynamo", "lowband.training.session", "lowband.training.trainer", "lowband.catalog"]
MESSAGE_BYTES = 1 << 20  # a command (its environment included) fits; a larger one is refused by the caller
ENDED = -signal.SIGKILL  # the exit code of a command whose server is gone: its child died with it
_client: Client | None = None


# ---- the caller's side -------------------------------------------------------------------------
class Client:
    """This process's connection to its server: starts commands, collects their pids and exit codes."""

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server = procs.start([sys.executable, "-m", "lowband.training.warm", "serve", str(theirs.fileno())],
                                  pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock, self.codes, self.cpu, self.gone = mine, {}, {}, False

    def start(self, entry: str, argv: list[str], env: dict, stdio: tuple[int, int, int], cwd: str) -> int:
        """Send one command; its pid once the server has forked it."""
        message = json.dumps({"entry": entry, "argv": argv, "env": env, "cwd": cwd,
                              "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}).encode()
        if len(message) > MESSAGE_BYTES:
            raise OSError(f"a command of {len(message)} bytes is more than the server takes ({MESSAGE_BYTES})")
        try:
            socket.send_fds(self.sock, [message], list(stdio))
        except OSError as e:
            raise OSError(self._stopped(e)) from None
        while True:
            reply = self._receive(block=True)
            if reply is None:
                raise OSError(self._stopped())
            if "pid" in reply and "code" not in reply:
                return reply["pid"]

    def _stopped(self, error: OSError | None = None) -> str:
        """Why a command could not be sent: the server's exit code, else the socket's error."""
        try:
            return f"lowband's warm-start server stopped (exit {self.server.wait(timeout=2)})"
        except subprocess.TimeoutExpired:
            return f"lowband's warm-start server did not take the command ({error})"

    def code(self, pid: int) -> int | None:
        """The command's exit code, None while it runs."""
        while pid not in self.codes and not self.gone and self._receive(block=False) is not None:
            pass
        return self.codes.get(pid, ENDED if self.gone else None)

    def _receive(self, block: bool) -> dict | None:
        """One message (exit codes are kept as they come); None when none is waiting or the server is gone."""
        if not block and not select.select([self.sock], [], [], 0)[0]:
            return None
        try:
            data = self.sock.recv(MESSAGE_BYTES)
        except ConnectionResetError:
            data = b""
        if not data:
            self.gone = True
            return None
        reply = json.loads(data)
        if "code" in reply:
            self.codes[reply["pid"]] = reply["code"]
            self.cpu[reply["pid"]] = reply["cpu_s"]
        return reply


class Command(procs.Child):
    """A command started warm: its exit code from the server's messages."""

    def __init__(self, client: Client, pid: int):
        self.client, self.pid = client, pid

    @property
    def returncode(self) -> int | None:
        return self.client.code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    @property
    def cpu_s(self) -> float | None:
        """The CPU seconds (user + system) the command and its workers took, once it has ended."""
        return self.client.cpu.get(self.pid)


def prestart() -> None:
    """Start this process's server now, in this environment, so that the first command starts warm too (its
    server then imports in the background while the caller goes on)."""
    if can_fork():
        _live_client()


def _live_client() -> Client:
    """This process's server, started anew when there is none or it has stopped."""
    global _client
    if _client is None or _client.gone or _client.server.poll() is not None:
        if _client is not None:
            _client.sock.close()
        _client = Client()
    return _client


def start(entry: str, argv: list[str], env: dict | None = None, stdio: tuple[int, int, int] = (0, 1, 2),
          cwd: str | None = None) -> Command | subprocess.Popen:
    """Start ENTRY(ARGV) (ENTRY a 'module:function' returning an exit code) in a process of its own, with
    environment `env` (default: this process's), the descriptors `stdio` as its stdin, stdout and stderr
    (default: this process's) and the directory `cwd` (default: this one); warm where forking is safe."""
    env, cwd = dict(os.environ if env is None else env), cwd or os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    if can_fork():
        client = _live_client()
        try:
            return Command(client, client.start(entry, argv, env, stdio, cwd))
        except OSError as e:  # the server could not start or died: this command starts cold
            print(f"lowband: warning: {e}; starting cold", file=sys.stderr, flush=True)
    own = [None if fd == n else fd for n, fd in enumerate(stdio)]  # None: inherited, as the default is
    return procs.start([sys.executable, "-m", "lowband.training.warm", "run", entry, *argv], env=env, cwd=cwd,
                       stdin=own[0], stdout=own[1], stderr=own[2])


def run(entry: str, argv: list[str]) -> int:
    """ENTRY(ARGV)'s exit code."""
    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function)(argv)


# ---- the server's side -------------------------------------------------------------------------
def serve(sock: socket.socket) -> None:
    """Fork a child per command received, report its pid and, once reaped, its exit code; end with the caller."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle, and its commands'
    running: set[int] = set()
    while True:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
            except OSError:  # the caller died (its end reset): nothing to serve, nothing to say
                return
            if not message:
                return  # the caller closed its end
            pid = procs.fork()
            if pid == 0:
                _child(sock, json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            running.add(pid)
            sock.send(json.dumps({"pid": pid}).encode())
        try:
            running -= _reap(sock, running)
        except OSError:  # the caller left while a child ended: its children die with it
            return


def _reap(sock: socket.socket, running: set[int]) -> set[int]:
    """The children that have ended, each reported with its exit code."""
    ended = set()
    for pid in running:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done == pid:
            cpu_s = usage.ru_utime + usage.ru_stime  # its workers' included: the launcher waits for them
            sock.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status), "cpu_s": cpu_s}).encode())
            ended.add(pid)
    return ended


def _child(sock: socket.socket, command: dict, fds: list[int]) -> None:
    """The forked child: the caller's stdio, directory and environment, then the command; never returns."""
    code = 1
    try:
        sock.close()
        procs.die_with_parent()
        if not command["sigint_ignored"]:  # as a subprocess inherits it (nohup, a background shell)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(command["cwd"])
        os.environ.clear()
        os.environ.update(command["env"])
        pythonpath = [p for p in command["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [command["cwd"], *pythonpath]  # as `python -m lowband` in that directory would have it
        sys.argv = ["lowband", *command["argv"]]
        code = run(command["entry"], command["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - an entry reports its own failures; this is the last guard
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        leave_now(code)


def main(argv: list[str]) -> int:
    """`python -m lowband.training.warm serve FD`: the server, FD its end of the caller's socket;
    `python -m lowband.training.warm run ENTRY ARGS...`: one command started cold."""
    if argv[0] == "run":
        return run(argv[1], argv[2:])
    for name in PRELOAD:
        importlib.import_module(name)
    importlib.import_module("lowband.catalog").load_all()  # the methods, models and data sets
    serve(socket.socket(fileno=int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
