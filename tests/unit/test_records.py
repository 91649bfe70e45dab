"""Typed records against the files users read: metrics.jsonl lines and summary.csv rows keep their keys."""

import json

import pytest

from lowband.comparison.summary import SummaryRow
from lowband.records import EpochRecord

# a reporter's line as lowband wrote it before records were typed (keys in the written order)
LINE = {"epoch": 2, "samples": 640, "train_loss": 1.5, "train_loss_ranks": [1.4, 1.6], "test_acc": 0.5,
        "val_acc": 0.6, "test_loss": 1.2, "val_loss": 1.1, "test_acc_L": 0.55, "val_acc_L": 0.65,
        "test_acc_ranks": [0.5, 0.55], "val_acc_ranks": [0.6, 0.65], "bytes_sent_per_worker": 100.0,
        "bytes_recv_per_worker": 90.0, "bytes_inter_per_worker": 0.0,
        "bytes": {"grad": {"sent": 100.0, "recv": 90.0, "calls": 2, "wire": 100.0, "inter": 0.0}},
        "bytes_total": {"grad": {"sent": 200.0, "recv": 180.0, "calls": 4, "wire": 200.0, "inter": 0.0}},
        "steps": 20, "samples_per_s": 320.0, "lr": 0.1, "time": {"epoch_train_s": 2.0, "train_s": 4.0},
        "reached_target_epoch": None, "diff_lg": 0.01}


def test_a_line_reads_back_and_writes_the_same_keys_in_the_same_order():
    record = EpochRecord.from_json(LINE)
    assert record.extra == {"diff_lg": 0.01} and record.train_s == 4.0 and record.value("diff_lg") == 0.01
    assert json.dumps(record.to_json()) == json.dumps(LINE)
    assert record.value("nothing_here") is None


def test_bits_per_byte_travel_together_and_classifiers_carry_none():
    assert "val_bpb" not in EpochRecord(epoch=1, val_acc=0.5).to_json()
    no_val = EpochRecord(epoch=1, test_bpb=2.0).to_json()  # a language model without a validation split
    assert no_val["val_bpb"] is None and no_val["test_bpb"] == 2.0


def test_only_set_leaves_out_what_a_partial_record_never_filled():
    out = EpochRecord(epoch=3, train_loss=1.0, val_acc=0.4, extra={"rounds": 7}).to_json(only_set=True)
    assert out == {"epoch": 3, "train_loss": 1.0, "val_acc": 0.4, "rounds": 7}


def test_reading_a_record_as_a_dict_still_works_with_a_warning():
    record = EpochRecord.from_json(LINE)
    with pytest.warns(DeprecationWarning):
        assert record["val_acc"] == 0.6
    with pytest.warns(DeprecationWarning):
        assert record.get("diff_lg") == 0.01 and record.get("absent", 3) == 3


def test_summary_rows_keep_their_columns_and_read_damaged_cells_as_defaults():
    assert SummaryRow.columns()[:4] == ["label", "method", "seed", "workers"]
    assert SummaryRow.columns()[-3:] == ["tuned", "status", "run_dir"]
    row = SummaryRow(label="a", method="allreduce", seed=1, workers=4, val_acc=0.5, status="failed (1)")
    back = SummaryRow.from_csv({k: str(v) for k, v in row.csv_row().items()})
    assert back == row
    damaged = SummaryRow.from_csv({"label": "b", "method": "single", "seed": "inf", "workers": "x", "val_acc": "nan"})
    assert (damaged.seed, damaged.workers, damaged.val_acc) == (None, 1, None)
