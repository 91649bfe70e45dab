"""benchmarks/chaos.py's checks fail when something is lost: a planted loss of one epoch's record, a planted
collapse to chance, a crash file, a hung joiner, fewer faults injected than planned, a job that needed a
resume. (The old loss rule, mean + 3 sd over two baseline seeds, passed anything up to 1.10.)"""

from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import chaos  # noqa: E402

pytestmark = pytest.mark.unit
BASELINE = [0.79, 0.81]


def test_a_lost_epoch_record_fails_the_records_check():
    recs = [{"epoch": e} for e in range(1, 11)]
    assert chaos.epochs_once(recs, 10)
    assert not chaos.epochs_once(recs[:4] + recs[5:], 10)  # epoch 5 lost
    assert not chaos.epochs_once(recs + recs[-1:], 10)  # one written twice
    assert not chaos.epochs_once(recs[:9], 10)  # the last one missing


@pytest.mark.parametrize("loss, ok", [(0.70, True), (0.81, True), (0.95, True), (0.97, False), (1.10, False),
                                      (chaos.CHANCE, False), (math.nan, False)])
def test_the_loss_check_passes_the_fault_free_range_plus_its_margin_and_never_a_collapse(loss, ok):
    assert chaos.loss_limit(BASELINE) == pytest.approx(0.81 + 0.1 * (chaos.CHANCE - 0.81))
    assert chaos.within_spread(loss, BASELINE) is ok


def test_a_baseline_near_chance_cannot_vouch_for_anything():
    assert not chaos.trained([2.30, 2.29])
    assert not chaos.within_spread(2.2, [2.2, 2.25])  # a collapse beside a collapse is still a collapse


def test_a_crash_file_fails_and_is_named(tmp_path):
    assert chaos.crash_files(str(tmp_path)) == []
    (tmp_path / "crash.rank2.txt").write_text("lost its connection to a peer\n\nTraceback ...")
    assert [os.path.basename(p) for p in chaos.crash_files(str(tmp_path))] == ["crash.rank2.txt"]


def soak(tmp_path, **kw) -> chaos.ElasticSoak:
    args = SimpleNamespace(seed=0, faults=90, epochs=3, every=(1, 2), baseline=[0], baseline_dir=str(tmp_path))
    s = chaos.ElasticSoak(args, str(tmp_path))
    s.faults = {"kill": 29, "stop": 30, "join": 29, "coordinator": 1, "writer": 1}
    s.exit_code, s.resumes = 0, 0
    for key, value in kw.items():
        setattr(s, key, value)
    return s


@pytest.mark.parametrize("change, check", [
    ({"exit_code": 1}, "exit"), ({"resumes": 1}, "exit"), ({"hung": [4242]}, "joiners"),
    ({"faults": {"kill": 29, "stop": 30, "join": 29, "coordinator": 1, "writer": 0}}, "faults")])
def test_the_soak_fails_on_an_exit_a_resume_a_hung_joiner_or_a_missing_fault(tmp_path, monkeypatch, capsys, change,
                                                                             check):
    for name in ("finished", "each_sample_once", "checksums_verify", "keys_expire"):
        monkeypatch.setattr(chaos, name, lambda *a: True)
    monkeypatch.setattr(chaos, "records", lambda run: [{"epoch": e, "val_loss": 0.8} for e in (1, 2, 3)])
    monkeypatch.setattr(chaos, "leftovers", lambda run: [])
    assert soak(tmp_path).check("redis://unused", BASELINE)  # all well: passes
    assert not soak(tmp_path, **change).check("redis://unused", BASELINE)
    assert f"{check:10} FAILED" in capsys.readouterr().out
