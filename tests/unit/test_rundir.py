"""RunDir's record streams: what resume keeps and what it drops."""

from __future__ import annotations

import json
import os

import pytest

from lowband.run.rundir import RunDir


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_cut_back_keeps_records_up_to_the_epoch_fractional_ones_included(tmp_path, capsys):
    rounds = [{"round": n, "epoch": e} for n, e in enumerate([0.6, 1.2, 1.9, 2.4, 3.0], 1)]
    _write(tmp_path / "rounds.jsonl", rounds)
    _write(tmp_path / "metrics.jsonl", [{"epoch": e} for e in (1, 2, 3)])
    _write(tmp_path / "distill.rank1.jsonl", [{"epoch": e} for e in (1, 2, 3)])
    RunDir(str(tmp_path)).cut_back(2)
    assert [r["round"] for r in RunDir(str(tmp_path)).read("rounds")] == [1, 2, 3]
    assert [r["epoch"] for r in RunDir(str(tmp_path)).read("metrics")] == [1, 2]
    assert len((tmp_path / "distill.rank1.jsonl").read_text().splitlines()) == 3  # rank 1 cuts its own
    assert capsys.readouterr().err == ""


def test_a_record_whose_epoch_is_not_a_number_is_skipped_with_one_warning(tmp_path, capsys):
    _write(tmp_path / "rounds.jsonl", [{"epoch": 0.5}, {"epoch": True}, {"epoch": "x"}, {"epoch": 1}])
    assert [r["epoch"] for r in RunDir(str(tmp_path)).read("rounds")] == [0.5, 1]
    assert len(capsys.readouterr().err.splitlines()) == 2


def test_a_run_directory_is_held_by_one_launcher_at_a_time(tmp_path):
    """A second launcher for a directory in use is refused in one line naming the holder; the first one's
    directory is untouched, and once it lets go the directory can be held again."""
    from lowband.errors import UsageError
    from lowband.run.rundir import held

    run = str(tmp_path / "run")
    with held(run):
        with pytest.raises(UsageError, match=r"^--run-dir .* is in use by another lowband process \(pid \d+\)"), \
                held(run):
            pass
        assert os.path.isdir(run)
    with held(run):
        pass


def test_a_run_that_never_started_leaves_no_directory(tmp_path):
    from lowband.run.rundir import held

    run = tmp_path / "run"
    with pytest.raises(RuntimeError), held(str(run)):
        raise RuntimeError("a check failed before any worker started")
    assert not run.exists()


@pytest.mark.parametrize("stop", ["Terminated", "KeyboardInterrupt"])
def test_a_run_stopped_once_prepared_keeps_its_folder_for_resume(tmp_path, stop):
    """SIGTERM to an elastic job's launcher in its first epoch (no record yet) once deleted the whole folder."""
    from lowband import errors
    from lowband.run.rundir import RunDir, held

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), held(str(run)):
        RunDir(str(run)).write_text("config.toml", "[train]\n")
        raise getattr(errors, stop, KeyboardInterrupt)()
    assert (run / "config.toml").exists()


@pytest.mark.parametrize("where, says", [("afile", "is a regular file, not a directory"),
                                         ("afile/sub", "afile on its way is a regular file")])
def test_a_run_directory_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys, where, says):
    from lowband.cli import main

    (tmp_path / "afile").write_text("not a directory")
    code = main(["train", "--workers", "2", "--epochs", "1", "--samples", "300", "--run-dir", str(tmp_path / where)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert (tmp_path / "afile").read_text() == "not a directory"


@pytest.mark.parametrize("name, make, says", [("metrics.jsonl", "dir", "metrics.jsonl there is not a file"),
                                              ("checkpoints", "file", "checkpoints there is not a directory")])
def test_a_run_directory_whose_files_are_of_the_wrong_kind_is_one_line_before_any_worker(tmp_path, capsys, name,
                                                                                        make, says):
    from lowband.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if make == "dir" else (run / name).write_text("")
    code = main(["train", "--workers", "2", "--epochs", "1", "--samples", "300", "--run-dir", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert sorted(p.name for p in run.iterdir()) == sorted([name, ".lowband.lock"])  # nothing else written
