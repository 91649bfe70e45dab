"""RunDir's record streams: what resume keeps and what it drops."""

from __future__ import annotations

import json

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
