"""An elastic job's lineage of θ_global versions (training/elastic/lineage.py): which rounds survive."""

from __future__ import annotations

import json

import pytest

from lowband.training.elastic.lineage import audit_samples, last_record, lost_rounds, span, surviving_rounds

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


def slices(round_no: int, version: int, epoch: int, handed: dict[int, tuple[int, int]], contributors,
           dropped: int = 0) -> dict:
    """A round's record: the slices it hands out for the next round, who contributed to it."""
    return {"round": round_no, "version": version, "epoch": epoch, "dropped": dropped,
            "contributors": list(contributors), "slices": {str(w): list(s) for w, s in handed.items()}}


def test_the_sample_audit_counts_a_slice_only_when_its_worker_contributes_to_the_next_round():
    # round 0 hands 0-4 to worker 0 and 4-8 to worker 1; worker 1 dies, so round 1 has only worker 0's
    # training and hands 4-8 out again, to worker 0: nothing is trained twice
    recs = [slices(0, 1, 0, {0: (0, 4), 1: (4, 8)}, [0, 1]),
            slices(1, 2, 0, {0: (4, 8)}, [0]),
            slices(2, 3, 1, {0: (0, 8)}, [0], dropped=0)]
    audit = audit_samples(recs)
    assert audit.ok and (audit.handed, audit.trained, audit.lost) == (16, 8, 0), audit
    # had worker 1 contributed to round 1, positions 4-8 would be trained in from round 0 and from round 1
    recs[1]["contributors"] = [0, 1]
    assert audit_samples(recs).twice.startswith("epoch 0: position 4 trained in from round 0's slice and again")


def test_the_sample_audit_finds_a_gap_in_an_epochs_order_and_allows_a_lost_lineage_to_hand_out_again():
    gap = [slices(0, 1, 0, {0: (0, 4)}, [0]), slices(1, 2, 0, {0: (6, 8)}, [0]), slices(2, 3, 1, {0: (0, 2)}, [0])]
    assert audit_samples(gap).skipped == "epoch 0: positions 4..5 never handed out"
    # rounds 1-2 (versions 2-3) are lost with their holder; round 3 goes on from version 1 and hands 4-8 again
    lost = [slices(0, 1, 0, {0: (0, 4)}, [0]), slices(1, 2, 0, {0: (4, 8)}, [0]),
            slices(2, 3, 1, {0: (0, 4)}, [0]), slices(3, 2, 0, {0: (4, 8)}, [0]), slices(4, 3, 1, {0: (0, 4)}, [0])]
    audit = audit_samples(lost)
    assert audit.ok and audit.lost == 2, audit
