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


def test_an_elastic_jobs_bytes_and_target_epoch_are_counted_as_the_trainer_counts_them():
    """Ledgers summed by tag (a pre-recv checkpoint's floats read as sent; the resumed part is no worker),
    and the first epoch reaching a target in the workload's direction, from the earlier records."""
    from lowband.data.metric import ACCURACY, BITS_PER_BYTE
    from lowband.run.reporter import first_reached
    from lowband.training.elastic.records import EARLIER, bytes_by_tag

    ledgers = {"0": {"params": {"sent": 10.0, "recv": 8.0}}, "1": {"params": {"sent": 6.0, "recv": 4.0},
               "join": {"sent": 3.0, "recv": 0.0}}, EARLIER: {"params": 100.0}}
    by_tag, workers = bytes_by_tag(ledgers)
    assert by_tag == {"params": {"sent": 116.0, "recv": 12.0}, "join": {"sent": 3.0, "recv": 0.0}} and workers == 2
    earlier = [EpochRecord(epoch=1, val_acc=0.3), EpochRecord(epoch=2, val_acc=0.6)]
    now = EpochRecord(epoch=3, val_acc=0.7)
    assert first_reached([*earlier, now], ACCURACY, 0.5) == 2
    assert first_reached([*earlier, now], ACCURACY, 0.65) == 3
    assert first_reached([*earlier, now], ACCURACY, 0.9) is None and first_reached([*earlier, now], ACCURACY, 0) is None
    bpb = [EpochRecord(epoch=1, val_bpb=2.5, val_loss=1.0), EpochRecord(epoch=2, val_bpb=1.9, val_loss=0.9)]
    assert first_reached(bpb, BITS_PER_BYTE, 2.0) == 2  # bits per byte: lower reaches
    assert first_reached([EpochRecord(epoch=1)], ACCURACY, 0.5) is None  # an epoch left unevaluated


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
