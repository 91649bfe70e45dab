"""An elastic job's lineage of θ_global versions (training/elastic/lineage.py): which rounds survive."""

from __future__ import annotations

import json

import pytest

from lowband.training.elastic.lineage import last_record, lost_rounds, span, surviving_rounds

pytestmark = pytest.mark.unit


def rec(round_no: int, version: int) -> dict:
    return {"round": round_no, "version": version, "slices": {}}


def test_a_lineage_lost_with_its_holders_does_not_survive_and_a_resumed_one_does():
    # rounds 0-5 make versions 1-6; round 6's source held version 3: rounds 3-5 are lost, the job goes on
    recs = [rec(r, r + 1) for r in range(6)] + [rec(6, 4), rec(7, 5)]
    assert [r["round"] for r in surviving_rounds(recs)] == [0, 1, 2, 6, 7]
    # lost twice over: round 9's source held version 2 (round 1's), so round 2 and rounds 6-8 are lost too
    recs += [rec(8, 6), rec(9, 3)]
    assert [r["round"] for r in surviving_rounds(recs)] == [0, 1, 9]
    assert surviving_rounds([]) == []


def test_a_round_names_what_it_leaves_behind_from_the_files_tail(tmp_path):
    path = tmp_path / "quorums.jsonl"
    assert lost_rounds(str(path), 1, 0) == [] and last_record(str(path)) is None  # no file yet
    path.write_text("".join(json.dumps(rec(r, r + 1)) + "\n" for r in range(6)) + '{"round": 6, "vers')
    assert last_record(str(path)) == rec(5, 6)  # a line being written is passed over
    assert lost_rounds(str(path), 7, 6) == []  # the usual round: one version newer than the last
    assert lost_rounds(str(path), 4, 6) == [3, 4, 5]
    assert lost_rounds(str(path), 6, 5) == []  # round 5 again, committed by the other side of a split vote
    assert [span(r) for r in ([3], [3, 4, 5], [3, 5, 8])] == ["round 3", "rounds 3-5", "rounds 3, 5, 8"]
