"""Every path flag meets the file system in one line (lowband/paths.py): a table of what can be in the way
(a file, a file on the way, a missing parent, a read-only or immutable folder, a FIFO, a symbolic link, a
directory where a file goes) against every flag that names a folder or file lowband writes. Each refusal
is one line naming the flag and the path, exit code 2, and nothing is written or left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BENCH = os.path.join(ROOT, "benchmarks")


@contextlib.contextmanager
def unwritable(folder, how: str):
    """`folder` made read-only (a read-only tmpfs mounted on it, as root; mode 555 otherwise) or immutable
    (chattr +i, as root; mode 555 otherwise): root passes every permission bit, so bits prove nothing."""
    folder.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    on, off = ((["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(folder)], ["umount", str(folder)])
               if how == "read-only" else (["chattr", "+i", str(folder)], ["chattr", "-i", str(folder)]))
    if subprocess.run(on, capture_output=True).returncode != 0:
        pytest.skip(f"cannot make a {how} folder here ({on[0]} refused)")
    try:
        yield
    finally:
        subprocess.run(off, capture_output=True)


def lay(tmp_path, case: str):
    """What `case` puts in the way under tmp_path; returns (the path to give, a context that holds it)."""
    (tmp_path / "afile").write_text("keep")
    if case == "file":
        return tmp_path / "afile", contextlib.nullcontext()
    if case == "file-in-path":
        return tmp_path / "afile" / "sub", contextlib.nullcontext()
    if case == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo", contextlib.nullcontext()
    if case == "symlink-to-file":
        os.symlink(tmp_path / "afile", tmp_path / "link")
        return tmp_path / "link", contextlib.nullcontext()
    if case in ("read-only", "immutable"):
        return tmp_path / "locked", unwritable(tmp_path / "locked", case)
    raise AssertionError(case)


CASES = ["file", "file-in-path", "fifo", "symlink-to-file", "read-only", "immutable"]
SAYS = {"file": "is a regular file, not a directory", "file-in-path": "is a regular file, not a directory",
        "fifo": "is a FIFO, not a directory", "symlink-to-file": "is a symbolic link, not a directory",
        "read-only": "cannot be written", "immutable": "cannot be written"}


def refused(capsys, code: int, flag: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"lowband: error: {flag} "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("flag, argv", [
    ("--run-dir", ["train", "--workers", "2", "--epochs", "1", "--samples", "300", "--run-dir"]),
    ("--out", ["train", "--workers", "2", "--epochs", "1", "--samples", "300", "--out"]),
    ("--out", ["compare", "--suite", "quick", "--out"]),
    ("--out", ["compare", "--suite", "lm", "--methods", "edl", "--out"]),
])
def test_a_folder_flag_that_cannot_be_written_is_one_line(tmp_path, capsys, case, flag, argv):
    from lowband.cli import main

    path, hold = lay(tmp_path, case)
    with hold:
        err = refused(capsys, main([*argv, str(path)]), flag)
        assert SAYS[case] in err or (case in ("read-only", "immutable") and "cannot be written" in err), err
    assert (tmp_path / "afile").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"afile", *(["fifo"] if case == "fifo" else []), *(["link"] if case == "symlink-to-file" else []),
         *(["locked"] if case in ("read-only", "immutable") else [])})  # nothing made


def test_a_missing_parent_is_made_only_when_the_run_starts(tmp_path, capsys):
    """A new folder deep below a missing parent is fine; a command refused for another reason makes nothing."""
    from lowband.cli import main

    code = main(["train", "--workers", "0", "--run-dir", str(tmp_path / "a" / "b" / "run")])
    assert code == 2 and not (tmp_path / "a").exists()


def run_dir(tmp_path):
    """A run directory a resume would take: a config.toml (the default configuration) and nothing else."""
    from lowband.training.runconfig import write_config
    from tests.unit.test_config import build

    run = tmp_path / "locked"
    run.mkdir()
    write_config(build({"train": {"workers": 2}}), str(run))
    return run


def test_a_resume_of_an_immutable_folder_is_one_line(tmp_path, capsys):
    """The lock check alone passes here (an existing file is still writable); the probe file does not."""
    from lowband.cli import main

    run = run_dir(tmp_path)
    case = "immutable"
    before = sorted(p.name for p in run.iterdir())
    with unwritable(run, case):
        err = refused(capsys, main(["train", "--resume", str(run), "--epochs", "2"]), "--resume")
        assert "cannot be written" in err
    assert sorted(p.name for p in run.iterdir()) == before


# ---- the lock ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, says", [("symlink", "is a symbolic link"), ("fifo", "is a FIFO"),
                                        ("directory", "is a directory")])
def test_a_lock_that_is_not_a_regular_file_is_refused_and_never_written_through(tmp_path, case, says):
    from lowband.errors import UsageError
    from lowband.run.rundir import LOCK, held

    run, target = tmp_path / "run", tmp_path / "outside.txt"
    run.mkdir()
    target.write_text("untouched")
    lock = run / LOCK
    if case == "symlink":
        os.symlink(target, lock)
    elif case == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    with pytest.raises(UsageError, match=rf"^--resume {run}: its lock file {LOCK} {says}, not a regular file"), \
            held(str(run), "--resume"):
        pass
    assert target.read_text() == "untouched"
    assert os.path.lexists(lock)  # the user's, left as it was


def test_a_lock_held_by_another_program_names_that_program_not_a_stale_pid(tmp_path):
    """The pid written in the file is an old launcher's; the holder is whoever the kernel says holds it."""
    from lowband.errors import UsageError
    from lowband.run.rundir import LOCK, held

    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text("4242424")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\n"
                               "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)",
                               str(run / LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError) as caught, held(str(run), "--resume"):
            pass
    finally:
        holder.kill()
        holder.wait()
    said = str(caught.value)
    assert said.startswith(f"--resume {run} is in use by another program (pid {holder.pid}"), said
    assert "4242424" not in said


# ---- the files a command writes ----------------------------------------------------------------------

@pytest.mark.parametrize("case, says", [("directory", "is a directory, not a file"), ("fifo", "is a FIFO, not a file"),
                                        ("file-in-path", "is a regular file, not a directory")])
def test_a_file_flag_with_something_in_the_way_is_one_line(tmp_path, case, says):
    from lowband.errors import UsageError
    from lowband.paths import writable_file

    (tmp_path / "afile").write_text("keep")
    path = {"directory": tmp_path, "fifo": tmp_path / "fifo", "file-in-path": tmp_path / "afile" / "x.png"}[case]
    if case == "fifo":
        os.mkfifo(path)
    with pytest.raises(UsageError, match=rf"^--figure {path}.*{says}"):
        writable_file(str(path), "--figure")
    assert (tmp_path / "afile").read_text() == "keep"


# ---- the tools shipped in benchmarks/ -------------------------------------------------------------

def tool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=BENCH, timeout=120)


@pytest.mark.parametrize("argv, says", [
    (["ladder.py"], "nothing to do"),
    (["ladder.py", "--run", "--device", "tpu"], "--device 'tpu'"),
    (["ladder.py", "--report", "--figure", "{afile}/x.png"], "--figure"),
    (["ladder.py", "--report", "--out", "{afile}"], "--out"),
    (["chaos.py", "--elastic", "--every", "-1", "-1"], "--every"),
    (["chaos.py", "--elastic", "--every", "nan", "nan"], "--every"),
    (["chaos.py", "--elastic", "--every", "30", "10"], "--every"),
    (["chaos.py", "--elastic", "--faults", "0"], "--faults"),
    (["chaos.py", "--elastic", "--keep", "{afile}"], "--keep"),
    (["chaos.py"], "nothing to do"),
    (["workers.py"], "nothing to do"),
    (["workers.py", "--run", "--cells", "tiny-k3-e1"], "--cells"),
    (["workers.py", "--report", "--figure", "{afile}/x.png"], "--figure"),
    (["gpu_check.py", "--epochs", "0"], "--epochs 0"),
    (["gpu_check.py", "--max-bytes", "-1"], "--max-bytes -1"),
    (["gpu_check.py", "--methods", ",:tau=4"], "--methods"),
    (["gpu_check.py", "--json", "{afile}/x.json"], "--json"),
])
def test_a_shipped_tool_refuses_bad_arguments_in_one_line_before_any_work(tmp_path, argv, says):
    (tmp_path / "afile").write_text("keep")
    p = tool(*[a.format(afile=tmp_path / "afile") for a in argv])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert lines[-1].startswith(f"{argv[0]}: error:") and all(ln.startswith(("usage:", " ")) for ln in lines[:-1]), \
        p.stderr  # argparse's usage, then one line
    assert (tmp_path / "afile").read_text() == "keep"


def test_every_planted_bug_names_code_that_is_in_the_tree(tmp_path):
    """A plant whose text drifted from the code tests nothing: it fails planted_bugs.py (and so this test)."""
    here = tool("planted_bugs.py", "--check")
    assert here.returncode == 0, here.stdout
    (tmp_path / "src").mkdir()  # a tree holding none of the plants' files
    gone = tool("planted_bugs.py", "--check", "--tree", str(tmp_path))
    assert gone.returncode == 1 and "its code is not in this tree" in gone.stdout
    assert tool("planted_bugs.py", "--check", "--tree", str(tmp_path), "--allow-absent").returncode == 0


def test_the_ladder_report_writes_into_out_and_leaves_the_committed_files_alone(tmp_path):
    """`--report --sizes nano --out DIR` once rewrote the package's ladder.json and ladder.csv with nano alone."""
    committed = [os.path.join(BENCH, "results", "ladder.json"),
                 os.path.join(BENCH, "results", "ladder.csv")]
    before = [Path(p).read_bytes() for p in committed]
    p = tool("ladder.py", "--report", "--sizes", "nano", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    assert [Path(p).read_bytes() for p in committed] == before
    assert (tmp_path / "ladder.csv").is_file() and (tmp_path / "ladder.json").is_file()
    assert (tmp_path / "ladder.png").is_file()
