"""report, churn and --target-from on damaged run directories: one line per problem, naming file and
line, and everything else still read."""

from __future__ import annotations

import json
import os

import pytest

from lowband.cli import main
from lowband.comparison.report import build
from lowband.run.metrics import read_metrics
from tests.unit.test_report import make_comparison, read, table

GOOD = json.dumps({"epoch": 1, "test_acc": 0.5, "val_acc": 0.5})


@pytest.mark.parametrize("bad, why", [
    ("{not json", "not JSON"), ("[1, 2]", "not an object"), ('{"epoch": "two"}', "not an integer"),
    ('{"epoch": 2, "val_acc": 0.6', "not JSON"),  # the half line a crash leaves
], ids=["garbage", "list", "epoch-string", "truncated"])
def test_damaged_metric_lines_are_skipped_with_file_and_line(tmp_path, capsys, bad, why):
    (tmp_path / "metrics.jsonl").write_text(f"{GOOD}\n{bad}\n{GOOD}\n")
    assert len(read_metrics(str(tmp_path))) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{tmp_path / 'metrics.jsonl'} line 2" in err[0] and why in err[0]


def test_binary_metrics_are_skipped_line_by_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_bytes(GOOD.encode() + b"\n\xff\xfe\x00\x81\n")
    assert len(read_metrics(str(tmp_path))) == 1
    assert "line 2: not UTF-8" in capsys.readouterr().err


def _damage_one_run(folder, text: str) -> None:
    run = folder / "allreduce-seed1" / "metrics.jsonl"
    lines = run.read_text().splitlines()
    run.write_text("\n".join([lines[0], text, *lines[1:]]) + "\n")


@pytest.mark.parametrize("text, why", [
    ("\x00garbage", "not JSON"), ('{"epoch": 4, "val_acc": 0.9}', "no time.epoch_train_s"),
    ('{"epoch": 4, "time": 3}', "no time.epoch_train_s"),
])
def test_report_skips_bad_records_and_still_reports(tmp_path, capsys, text, why):
    folder = make_comparison(tmp_path / "cmp")
    _damage_one_run(folder, text)
    md = read(build([str(folder)]))
    assert table(md)["allreduce"][1] == "2"  # both seeds still counted
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "allreduce-seed1/metrics.jsonl line 2" in err[0] and why in err[0]


def test_report_skips_summary_rows_without_a_run_dir(tmp_path, capsys):
    folder = make_comparison(tmp_path / "cmp")
    summary = folder / "summary.csv"
    lines = summary.read_text().splitlines()
    summary.write_text("\n".join([*lines, "allreduce,allreduce,9,4,ok,"]) + "\n")
    read(build([str(folder)]))
    err = capsys.readouterr().err
    assert f"{summary} line {len(lines) + 1}: no run_dir" in err and err.count("\n") == 1


def test_report_of_a_binary_summary_is_one_line(tmp_path, capsys):
    folder = make_comparison(tmp_path / "cmp")
    (folder / "summary.csv").write_bytes(b"\xff\xfe\x00\x81" * 50)
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.csv is unreadable" in err


def test_target_from_a_run_with_a_broken_line_reads_the_rest(tmp_path, capsys):
    from lowband.cli import final_accuracy

    (tmp_path / "metrics.jsonl").write_text(GOOD + "\n{broken\n" + json.dumps({"epoch": 2, "test_acc": 0.7}) + "\n")
    assert final_accuracy(str(tmp_path)) == 0.7
    assert "line 2" in capsys.readouterr().err


def _run_with_model(tmp_path, name: str, model_bytes: bytes | None = None) -> str:
    from lowband.models import build_model
    from lowband.run import checkpoint
    from lowband.training import runconfig
    from tests.unit.test_config import build as build_config

    run = str(tmp_path / name)
    os.makedirs(run)
    cfg = build_config({"data": {"num_samples": 200, "cache_dir": os.environ["LOWBAND_TEST_CACHE"]}})
    runconfig.write_config(cfg, run)
    path = os.path.join(run, "model.safetensors")
    if model_bytes is None:
        checkpoint.save_model(build_model(cfg.model, (1, 40), 10).state_dict(), path)
    else:
        with open(path, "wb") as f:
            f.write(model_bytes)
    return run


@pytest.mark.parametrize("case", ["garbage-model", "nonexistent", "changed-config"])
def test_churn_of_a_damaged_run_is_one_line(tmp_path, capsys, case):
    a = _run_with_model(tmp_path, "a")
    if case == "garbage-model":
        b, says = _run_with_model(tmp_path, "b", b"\x00garbage" * 10), "model.safetensors is unreadable"
    elif case == "nonexistent":
        b, says = str(tmp_path / "nope"), "is not a run directory"
    else:
        b = _run_with_model(tmp_path, "b")
        with open(os.path.join(b, "config.toml")) as f:
            text = f.read().replace('name = "cnn1d"', 'name = "mlp"')
        with open(os.path.join(b, "config.toml"), "w") as f:
            f.write(text)
        says = "does not fit the model in"  # and every difference, on the one line:
        says += (f" {b}/config.toml (mlp; was the config changed?): missing body.1.bias, body.1.weight, body.3.bias "
                 "and 1 more; unexpected body.0.bias, body.0.weight, body.2.bias and 3 more; fc.weight (10, 125) "
                 "(not (10, 256))\n")
    assert main(["churn", a, b]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "--resume" not in err, err


# ---- the files a comparison reads back after a crash ----------------------------------------------------

def test_a_cut_last_line_of_done_jsonl_is_dropped_with_a_note_and_appending_goes_on(tmp_path, capsys):
    from lowband.comparison.folder import ComparisonDir

    folder = ComparisonDir(str(tmp_path))
    folder.mark("run/a", "a", 0)
    (tmp_path / "done.jsonl").open("a").write('{"key": "run/b", "run_dir": "b", "co')  # killed mid-append
    assert list(folder.finished()) == ["run/a"]
    assert "line 2: not JSON" in capsys.readouterr().err
    folder.repair_done()
    assert "dropped a cut last line (36 bytes" in capsys.readouterr().err
    folder.mark("run/b", "b", 0)
    assert [json.loads(line)["key"] for line in (tmp_path / "done.jsonl").read_text().splitlines()] == ["run/a", "run/b"]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("plan, why", [(b"\x93\x00garbage", "UnicodeDecodeError"), (b"{}", "KeyError"),
                                       (b'{"labels": [1', "JSONDecodeError"), (b"[1]", "AttributeError")],
                         ids=["binary", "empty-object", "cut", "list"])
def test_a_damaged_plan_is_one_line_for_resume_and_no_budget_line_for_report(tmp_path, capsys, plan, why):
    folder = make_comparison(tmp_path / "cmp")
    (folder / "plan.json").write_bytes(plan)
    assert main(["compare", "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.json is damaged" in err and why in err, err
    assert main(["report", str(folder)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.json is damaged" in err
    md = read(str(folder / "report.md"))
    assert "Budget:" not in md and table(md)["allreduce"][1] == "2"


def test_an_unreadable_tuning_csv_is_skipped_with_a_warning(tmp_path, capsys):
    folder = make_comparison(tmp_path / "cmp")
    (folder / "tuning.csv").write_bytes(b"\xff\xfe\x00\x81" * 50)
    assert main(["report", str(folder)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tuning.csv: unreadable" in err
    assert "## Tuning" not in read(str(folder / "report.md"))


@pytest.mark.parametrize("job", [b"\x00\xff", b'{"coordinator": "redis://127.0.0.1:1/0", "jo', b"{}", b"[]"],
                         ids=["binary", "cut", "empty", "list"])
def test_join_on_a_damaged_elastic_json_is_one_line(tmp_path, capsys, job):
    (tmp_path / "elastic.json").write_bytes(job)
    assert main(["join", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "elastic.json is damaged" in err and f"--resume {tmp_path}" in err, err


def test_the_temporary_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    import subprocess
    import sys

    from lowband.atomic import write_text_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"summary.csv.tmp-{int(dead.stdout)}"  # its writer was killed mid-write
    alive = tmp_path / f"summary.csv.tmp-{os.getppid()}"  # a writer still running: its file is left alone
    other = tmp_path / f"tuning.csv.tmp-{int(dead.stdout)}"  # another file's: not this write's business
    for path in (orphan, alive, other):
        path.write_text("half")
    write_text_atomic(str(tmp_path / "summary.csv"), "whole\n")
    assert (tmp_path / "summary.csv").read_text() == "whole\n"
    assert not orphan.exists() and other.exists() and alive.exists()


def test_a_worker_that_leaves_mid_write_removes_its_temporary(tmp_path):
    """A worker leaves through launch.leave_now (os._exit: no finally runs), for instance when a second
    signal interrupts the first one's clean-up: the file it was writing must not stay half-written
    beside its final name (test_processes' Ctrl-C test once found rank1-epoch0001.pt.sha256.tmp-PID)."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from lowband.atomic import write_atomic\n"
              "from lowband.run.workers import leave_now\n"
              "def write(tmp):\n"
              "    open(tmp, 'w').write('half')\n"
              "    leave_now(130)\n"
              "write_atomic(sys.argv[1], write)\n")
    target = tmp_path / "rank1-epoch0001.pt.sha256"
    code = subprocess.run([sys.executable, "-c", script, str(target)], timeout=60).returncode
    assert code == 130
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def _elastic_job_with(tmp_path, state: dict) -> str:
    from lowband.run import checkpoint

    run = str(tmp_path / "job")
    os.makedirs(run)
    checkpoint.save_state(state, checkpoint.rank_path(run, 0, 2))
    with open(os.path.join(run, "quorums.jsonl"), "w") as f:
        f.write('{"round": 0, "epoch": 1, "slices": {}}\n{}\n{"round": 7, "epoch": 3, "slices": {}}\n')
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3}\n')
    return run


def test_an_elastic_resume_drops_damaged_round_lines_and_whats_past_its_checkpoint(tmp_path):
    """A `{}` line in quorums.jsonl (a write cut short) is dropped by the resume's cut, not a KeyError."""
    from lowband.run.rundir import RunDir
    from lowband.training.elastic.job import _resume_point

    run = _elastic_job_with(tmp_path, {"version": 5, "round": 5, "epoch": 2, "shared": {}, "extra": {}})
    assert _resume_point(run)[0] == 5
    assert [r.get("round") for r in RunDir(run).read("quorums")] == [0]
    assert [r["epoch"] for r in RunDir(run).read("metrics")] == [1, 2]


def test_an_elastic_resume_from_a_plain_runs_checkpoint_is_one_line(tmp_path):
    from lowband.errors import UsageError
    from lowband.training.elastic.job import _resume_point

    run = _elastic_job_with(tmp_path, {"epoch": 2, "step": 10, "model": {}})  # a plain run's, its checksum intact
    with pytest.raises(UsageError, match="is not an elastic job's checkpoint of this lowband") as e:
        _resume_point(run)
    assert "\n" not in str(e.value)
