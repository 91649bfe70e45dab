"""Failure injection: a killed worker, Ctrl-C, a killed launcher. No orphan may survive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lowband.run import checkpoint
from tests.conftest import ROOT, alive, children, processes_naming, small, wait_for, worker_rank


def start_run(tmp_path, world: int, timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    run = str(tmp_path / "run")
    args = ["train", "--method", "allreduce", "--workers", str(world), "--epochs", "200", "--run-dir", run,
            *small(tmp_path), "--samples", "3000", "--batch-size", "8", "--set", f"train.timeout_s={timeout_s}"]
    proc = subprocess.Popen([sys.executable, "-m", "lowband", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_sigint)
    return proc, run


def default_sigint() -> None:
    """A shell running us in the background (CI, nohup) hands SIGINT down as ignored; a terminal would not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_training(proc, run: str, world: int) -> list[int]:
    every_rank_saved = lambda: all(checkpoint.epochs_saved(run, r) for r in range(world))  # noqa: E731
    wait_for(lambda: every_rank_saved() or proc.poll() is not None, 120, "every rank's first checkpoint")
    assert proc.poll() is None, proc.communicate()
    workers = children(proc.pid)
    assert len(workers) == world
    return workers


def rank_of(pid: int) -> int:
    rank = worker_rank(pid)
    assert rank is not None, f"process {pid} is not a lowband worker"
    return rank


def test_killed_worker_stops_the_run_quickly_and_leaves_no_process(tmp_path):
    proc, run = start_run(tmp_path, world=3)
    workers = wait_training(proc, run, 3)
    victim = next(pid for pid in workers if rank_of(pid) == 1)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 15
    assert proc.returncode == 128 + signal.SIGKILL
    assert "worker 1" in err and "SIGKILL" in err
    assert err.count("\n") == 1 and "Traceback" not in err and "[rank" not in err, err  # said once, in our words
    assert not any(alive(pid) for pid in workers)
    for rank in range(3):  # every checkpoint under its final name is complete and readable
        for epoch in checkpoint.epochs_saved(run, rank):
            checkpoint.load_state(checkpoint.rank_path(run, rank, epoch))


def test_ctrl_c_stops_every_worker(tmp_path):
    proc, run = start_run(tmp_path, world=2)
    workers = wait_training(proc, run, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert not any(alive(pid) for pid in workers)
    assert not [f for f in os.listdir(run) if f.startswith(".rendezvous")]
    assert not [f for f in os.listdir(os.path.join(run, "checkpoints")) if ".tmp" in f]


def test_killed_launcher_takes_its_workers_with_it_and_the_run_resumes(tmp_path):
    proc, run = start_run(tmp_path, world=2)
    workers = wait_training(proc, run, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the orphaned workers to die")
    assert [f for f in os.listdir(run) if f.startswith(".rendezvous-")]  # a killed launcher cannot clean up
    saved = checkpoint.latest_common_epoch(run, 2)
    assert saved >= 1
    p = subprocess.run([sys.executable, "-m", "lowband", "train", "--resume", run, "--epochs", str(saved + 1)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    from lowband.run.metrics import read_metrics
    assert [r.epoch for r in read_metrics(run)] == list(range(1, saved + 2))
    assert not [f for f in os.listdir(run) if f.startswith(".rendezvous-")]  # the resume removed the orphan


def test_a_stopped_worker_timing_out_is_one_line_and_the_traceback_goes_to_the_crash_file(tmp_path):
    proc, run = start_run(tmp_path, world=2, timeout_s=4)
    workers = wait_training(proc, run, 2)
    victim = next(pid for pid in workers if rank_of(pid) == 1)
    os.kill(victim, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    crash = os.path.join(run, "crash.rank0.txt")
    assert proc.returncode == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "worker 0" in err and "timed out" in err and f"traceback in {crash}" in err
    with open(crash) as f:
        text = f.read()
    assert text.startswith("a collective with its peers timed out") and "Traceback (most recent call last)" in text
    assert not any(alive(pid) for pid in workers if pid != victim)


def test_a_crash_file_names_the_cause_once_and_the_errors_it_caused(tmp_path, capsys):
    # worker 1 crashes with its own error; worker 0 then fails on the collective: one line names both files
    from lowband.run.launch import supervise
    from lowband.run.workers import crash_path

    crash = ("import os, sys; os.environ['LOWBAND_INIT_FILE'] = sys.argv[1] + '/.rendezvous-x'; "
             "os.environ['RANK'] = sys.argv[2]; from lowband.run.workers import worker_main; "
             "sys.exit(worker_main([sys.argv[3]]))")
    after_rank_1 = ("import os, sys, time\nwhile not os.path.exists(os.path.join(sys.argv[1], 'crash.rank1.txt')): "
                    "time.sleep(0.01)\n")  # an event, not a head start: worker 0 fails once worker 1 has crashed
    procs = [subprocess.Popen([sys.executable, "-c", after_rank_1 + crash, str(tmp_path), "0",
                               "tests.faults.test_processes:peer_gone"]),
             subprocess.Popen([sys.executable, "-c", crash, str(tmp_path), "1", "tests.faults.test_processes:no_such"])]
    assert supervise(procs, crash_dir=str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lowband: worker 1 ") and "Traceback" not in err, err
    assert "AttributeError: module 'tests.faults.test_processes' has no attribute 'no_such'" in err
    assert f"traceback in {crash_path(str(tmp_path), 1)}" in err
    with open(crash_path(str(tmp_path), 1)) as f:
        assert "Traceback (most recent call last)" in f.read()


def peer_gone() -> None:
    """A worker whose collective fails because its peer left (what gloo says then)."""
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")


@pytest.mark.parametrize("args, field", [
    (["--workers", "0"], "train.workers=0"),  # a config value
    (["--method", "gossipy"], "method.name='gossipy'"),  # a name
    (["--dataset", "cifar10", "--set", "data.root='/no/such/dir'", "--model", "resnet20"], "data.root='/no/such/dir'"),
])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, args, field):
    """A real process per family of rules (a value, a name, missing data): exit code 2, one line, no
    traceback, nothing left. The other rules are checked in-process (tests/unit/test_bad_inputs.py)."""
    cache = os.environ["LOWBAND_TEST_CACHE"]
    p = subprocess.run([sys.executable, "-m", "lowband", "train", "--out", str(tmp_path / "runs"),
                        "--set", f"data.cache_dir={cache!r}", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lowband: error: ") and field in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()  # no run directory left behind


def test_a_divergence_explains_the_crash_of_a_peer_seen_first(capsys):
    # a rank that diverges (exit 4) can cut a peer's collective short, and the peer may crash first;
    # the launcher names the cause, not the consequence, and says nothing of the crash
    from lowband.run.launch import supervise

    crash = "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"
    diverge = "import sys, time; time.sleep(0.2); sys.exit(4)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (crash, diverge)]
    assert supervise(procs) == 4
    assert "SIGABRT" not in capsys.readouterr().err


def test_a_crash_alone_is_reported_with_its_signal(capsys):
    from lowband.run.launch import supervise

    procs = [subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"]),
             subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])]
    assert supervise(procs) == 134
    assert "worker 0" in capsys.readouterr().err and all(p.poll() is not None for p in procs)


def test_the_failure_seen_first_is_the_cause_when_none_explains_itself(capsys):
    # worker 1 is killed; worker 0, a lower rank, aborts 0.2 s later in the collective cut short:
    # the launcher reports the kill, not the abort that followed from it
    from lowband.run.launch import supervise

    abort_later = "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGABRT)"
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (abort_later, killed)]
    assert supervise(procs) == 128 + signal.SIGKILL
    err = capsys.readouterr().err
    assert "worker 1" in err and "SIGABRT" not in err


@pytest.mark.slow
def test_a_comparison_killed_while_it_prepares_leaves_nothing_training(tmp_path):
    """SIGKILL of `lowband compare --suite edl` while its teacher trains (the suite's preparation): the
    teacher's run and its worker die with it, and nothing goes on writing into the comparison's folder."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "lowband", "compare", "--suite", "edl", "--out", str(tmp_path), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("compare-*/teacher/train.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(tmp_path.glob("compare-*/teacher/train.log")), "the teacher never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5  # they die with it at once; the teacher alone would train for longer
    while processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_naming(str(tmp_path))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left


@pytest.mark.parametrize("after_s", [0.4, 1.0, 2.0])  # after the interpreter itself has started
def test_ctrl_c_during_start_up_is_one_line(tmp_path, after_s):
    """Ctrl-C while the command starts (Python importing torch, the launcher forking its workers): the one
    line "lowband: interrupted", no traceback, and no run directory for a run that never trained."""
    proc = subprocess.Popen([sys.executable, "-m", "lowband", "train", "--workers", "2", "--epochs", "1",
                             *small(tmp_path), "--run-dir", str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        return  # it finished before the signal came: nothing to check
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "lowband: interrupted", err[-2000:]
    assert not (tmp_path / "run").exists() or (tmp_path / "run" / "metrics.jsonl").exists()


def signal_once_training(proc: subprocess.Popen, folder, sig: int) -> None:
    """Send `sig` once a first epoch's record is written under `folder` (training, not starting up), or fail
    if the command ended before that."""
    def training() -> bool:
        assert proc.poll() is None, f"it ended (exit {proc.returncode}) before training: {proc.stderr.read()[-2000:]}"
        return any(p.stat().st_size > 0 for p in Path(folder).rglob("metrics.jsonl"))

    wait_for(training, 120, "a first epoch's record")
    proc.send_signal(sig)


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ["compare", "--methods", "single,allreduce", "--workers", "2", "--epochs", "300"],
    ["train", "--elastic", "--method", "local_sgd", "--workers", "2", "--epochs", "300"]])
def test_sigterm_stops_a_comparison_or_an_elastic_job_with_one_line(tmp_path, command):
    """SIGTERM (a scheduler, `kill`) cleans up as Ctrl-C does and says so: "lowband: stopped by SIGTERM", exit
    143, every worker and service stopped."""
    where = ["--out", str(tmp_path)] if command[0] == "compare" else ["--run-dir", str(tmp_path / "job")]
    proc = subprocess.Popen([sys.executable, "-m", "lowband", *command, *small(tmp_path), *where, "-q"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    signal_once_training(proc, tmp_path, signal.SIGTERM)
    _, err = proc.communicate(timeout=200)  # generous: a loaded 2-core machine is several times slower
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "lowband: stopped by SIGTERM", err[-2000:]
    assert "Traceback" not in err
    wait_for(lambda: not processes_naming(str(tmp_path)), 10, "every process of it to end")


def test_a_checkpoint_the_system_refuses_to_write_is_one_line(tmp_path):
    """A file-size limit smaller than a checkpoint (as a full disk would): one line naming the file and the
    cause in words (not torch's "[enforce fail at inline_container.cc]"), said once for all the ranks."""
    import resource

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    proc = subprocess.run([sys.executable, "-m", "lowband", "train", "--workers", "2", "--epochs", "1", "-q",
                           *small(tmp_path), "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, preexec_fn=small_files)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lowband: error:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-2000:]
    assert "could not write the checkpoint" in errors[0] and "file-size limit" in errors[0]
    assert "enforce fail" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_ctrl_c_during_a_tuning_search_is_one_line(tmp_path):
    """Ctrl-C while a trial trains (forked from the warm server): "lowband: interrupted", exit 130, and no
    traceback from the warm server whose caller went away."""
    proc = subprocess.Popen([sys.executable, "-m", "lowband", "compare", "--methods", "allreduce", "--workers", "2",
                             "--epochs", "300", *small(tmp_path), "--tune", "optim.lr=0.05,0.1,0.2", "--tune-epochs", "200",
                             "--out", str(tmp_path), "-q"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)  # as from a terminal, not CI's background shell
    signal_once_training(proc, tmp_path, signal.SIGINT)
    _, err = proc.communicate(timeout=200)  # generous: a loaded 2-core machine is several times slower
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "lowband: interrupted"
    wait_for(lambda: not processes_naming(str(tmp_path)), 10, "every process of it to end")
