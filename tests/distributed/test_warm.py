"""Warm starts (lowband.training.warm): `lowband ARGV` forked from the server behaves as `python -m lowband` would:
the same output, exit codes, records, directory and environment; a signal ends it with the same code;
and nothing outlives a killed caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from lowband.run.metrics import read_metrics
from lowband.training import warm
from tests.conftest import ROOT, alive, children, cli, small, wait_for

CLI = "lowband.cli:main"  # `lowband ARGV`


def train_args(out, run: str, epochs: int = 2) -> list[str]:
    return ["train", "--method", "local_sgd", "--workers", "2", "--epochs", str(epochs), "--run-dir", run,
            "-q", *small(out)]


def test_a_warm_command_prints_and_exits_as_a_cold_one(capfd):
    for argv in (["config", "--method", "diloco", "--set", "method.tau=7"],
                 ["train", "--method", "diloco", "--workers", "0"]):  # bad input: one line, exit 2
        cold = cli(*argv)
        command = warm.start(CLI, argv)
        assert isinstance(command, warm.Command)
        assert command.wait(timeout=60) == cold.returncode
        out, err = capfd.readouterr()
        assert (out, err) == (cold.stdout, cold.stderr)
    assert cold.returncode == 2 and len(err.splitlines()) == 1


def test_a_warm_run_trains_as_a_cold_one_in_the_callers_directory_and_environment(tmp_path, monkeypatch):
    assert cli(*train_args(tmp_path, str(tmp_path / "cold"))).returncode == 0
    monkeypatch.chdir(tmp_path)
    command = warm.start(CLI, train_args(tmp_path, "warm"), env={**os.environ, "LOWBAND_TEST_MARK": "warm"})
    assert command.wait(timeout=120) == 0
    cold, hot = read_metrics(str(tmp_path / "cold")), read_metrics(str(tmp_path / "warm"))
    assert [r.val_loss for r in hot] == [r.val_loss for r in cold] and len(hot) == 2
    assert [r.train_loss for r in hot] == [r.train_loss for r in cold]
    assert command.cpu_s is not None and command.cpu_s > 0  # the command's and its workers', from the server


def test_a_signal_ends_a_warm_run_as_it_ends_a_cold_one_and_leaves_no_worker(tmp_path):
    run = str(tmp_path / "run")
    command = warm.start(CLI, train_args(tmp_path, run, epochs=200) + ["--samples", "3000", "--batch-size", "8"])
    wait_for(lambda: read_metrics(run) or command.poll() is not None, 120, "the first epoch")
    workers = children(command.pid)
    assert command.poll() is None and len(workers) == 2
    command.send_signal(signal.SIGTERM)  # as the tuning stops a pruned trial
    assert command.wait(timeout=60) == 143  # the launcher stopped its workers and said "stopped by SIGTERM"
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers to end")
    assert command.cpu_s is not None


def test_a_killed_caller_takes_the_server_and_its_commands_with_it(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from lowband.training import warm
        command = warm.start("lowband.cli:main", {train_args(tmp_path, str(tmp_path / 'run'), epochs=200)!r})
        print(warm._client.server.pid, command.pid, flush=True)
        time.sleep(600)
    """)
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    server, trial = (int(pid) for pid in caller.stdout.readline().split())
    wait_for(lambda: len(children(trial)) == 2, 60, "the trial's workers")
    workers = children(trial)
    caller.kill()
    caller.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in (server, trial, *workers)), 15, "the orphans to die")


def test_where_workers_may_not_fork_a_command_starts_cold(monkeypatch, capfd):
    monkeypatch.setenv("LOWBAND_START", "exec")
    command = warm.start(CLI, ["config", "--method", "single"])
    assert isinstance(command, subprocess.Popen)
    assert command.wait(timeout=60) == 0 and "single" in capfd.readouterr().out


def test_a_command_whose_server_is_gone_reads_as_killed():
    command = warm.start(CLI, ["train", "--method", "single", "--epochs", "200", "-q", *small("unused")])
    os.kill(warm._client.server.pid, signal.SIGKILL)
    assert command.wait(timeout=30) == warm.ENDED
    wait_for(lambda: not alive(command.pid), 15, "the command to die with its server")
    later = warm.start(CLI, ["config", "--method", "single"])  # a new server takes over
    assert later.wait(timeout=60) == 0


@pytest.fixture(autouse=True)
def _quiet_output(capfd):
    yield
    capfd.readouterr()


def test_a_server_that_cannot_start_leaves_the_command_to_start_cold(tmp_path, monkeypatch, capfd):
    python = tmp_path / "python"  # an interpreter whose server exits at once, and that runs anything else
    python.write_text(f'#!/bin/sh\ncase "$*" in *" serve "*) exit 3;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(warm, "_client", None)
    command = warm.start(CLI, ["config", "--method", "single"])
    assert isinstance(command, subprocess.Popen) and command.wait(timeout=60) == 0
    out, err = capfd.readouterr()
    assert "single" in out
    assert err.strip() == "lowband: warning: lowband's warm-start server stopped (exit 3); starting cold"
