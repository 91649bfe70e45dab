"""The workload's metric: direction, margin and words, and the table, tuning and Pareto front that read it."""

import logging
import math

import pytest

from lowband.comm import Communicator
from lowband.comparison import table
from lowband.comparison.plots import pareto_front
from lowband.comparison.summary import SummaryRow
from lowband.data.metric import ACCURACY, BITS_PER_BYTE, bits_per_byte, metric_for, task_of
from lowband.records import EpochRecord
from lowband.run.reporter import EpochReporter, RankFigures
from lowband.run.rundir import RunDir


def test_each_data_set_names_its_workload():
    assert task_of("text") == task_of("text:/data/corpus") == "lm" and task_of("mnist1d") == "classify"
    assert metric_for("text:x") is BITS_PER_BYTE and metric_for("cifar10") is ACCURACY


def test_a_loss_reaches_its_target_within_the_relative_margin():
    assert BITS_PER_BYTE.reaches(2.02, 2.0) and not BITS_PER_BYTE.reaches(2.0201, 2.0)
    assert BITS_PER_BYTE.reaches(1.5, 2.0)  # lower is better
    assert BITS_PER_BYTE.threshold(2.0) == pytest.approx(2.02)
    assert ACCURACY.reaches(0.9, 0.9) and not ACCURACY.reaches(0.8999, 0.9)
    assert not ACCURACY.reaches(None, 0.9) and not BITS_PER_BYTE.reaches(1.0, None)


def test_better_best_and_gap_follow_the_direction():
    assert BITS_PER_BYTE.better(1.9, 2.0) and not BITS_PER_BYTE.better(2.1, 2.0)
    assert ACCURACY.better(0.9, 0.8) and BITS_PER_BYTE.best([2.1, 1.9, 2.0]) == 1.9
    assert ACCURACY.gap(0.905, 0.9) == "+0.50 pts" and BITS_PER_BYTE.gap(2.03, 2.0) == "+1.50%"
    assert "within 1%" in BITS_PER_BYTE.describe_target(2.0, "given") and "at most 2.0200" in \
        BITS_PER_BYTE.describe_target(2.0, "given")


def test_bits_per_byte_is_nats_over_ln2():
    assert bits_per_byte(math.log(2) * 3) == pytest.approx(3.0) and bits_per_byte(None) is None


def lm_run(label, bpbs, method=None, accs=None):
    records = [EpochRecord(epoch=e, val_acc=(accs or [0.3] * len(bpbs))[e - 1], test_acc=0.3, val_bpb=b,
                           test_bpb=b + 0.01, bytes_sent_per_worker=1e6 * e, samples=100 * e, time={"train_s": 2.0 * e})
               for e, b in enumerate(bpbs, 1)]
    return SummaryRow(label=label, method=method or label.split(":")[0], workers=4, records=records,
                      metric=BITS_PER_BYTE)


def test_the_table_reads_bits_per_byte_and_reaches_within_one_percent():
    runs = [lm_run("allreduce", [3.0, 2.5, 2.0]), lm_run("diloco:tau=16", [3.2, 2.6, 2.019]),
            lm_run("local_sgd:tau=16", [3.3, 2.8, 2.03])]
    rows, target, why = table.rows(runs)
    by = {r.label: r for r in rows}
    assert target == 2.0 and "bits per byte" in why
    assert by["diloco:tau=16"].epochs_to_target == 3  # 2.019 <= 2.02
    assert by["local_sgd:tau=16"].epochs_to_target is None  # 2.03 > 2.02, although lower loss came first
    assert by["allreduce"].val.mean == 2.0 and by["allreduce"].test.mean == pytest.approx(2.01)
    text = table.text(rows)
    assert "val bpb" in text and "test bpb" in text and "val acc" in text and "+0.95%" in text


def test_tuning_keeps_the_lowest_loss_for_a_loss_metric():
    from lowband.comparison.summary import TuningRow
    from lowband.comparison.tuning import choose

    def trials(vals):
        return [TuningRow(label="a", method="a", trial=i, field="optim.lr", value=str(v), val=val,
                          status="ok" if val is not None else "failed (1)")
                for i, (v, val) in enumerate(zip((0.1, 0.2, 0.4), vals, strict=True))]

    def chosen(vals, metric):
        best = choose(trials(vals), metric)
        return best.values if best else None

    assert chosen([2.1, 1.9, None], BITS_PER_BYTE) == {"optim.lr": "0.2"}
    assert chosen([0.8, 0.9, None], ACCURACY) == {"optim.lr": "0.2"}
    assert chosen([0.9, 0.8, None], ACCURACY) == {"optim.lr": "0.1"}


def test_the_pareto_front_of_a_loss_keeps_lower_values():
    points = [(1.0, 2.5), (2.0, 2.2), (3.0, 2.4), (4.0, 2.0)]
    assert pareto_front(points, higher_is_better=False) == [(1.0, 2.5), (2.0, 2.2), (4.0, 2.0)]
    assert pareto_front(points) == [(1.0, 2.5)]


def test_a_report_target_must_be_a_value_of_the_runs_metric():
    from lowband.comparison.report import check_target
    from lowband.errors import UsageError

    check_target(0.9, ACCURACY)
    check_target(2.1, BITS_PER_BYTE)
    with pytest.raises(UsageError, match=r"--target=2.1 is invalid: these runs report accuracy"):
        check_target(2.1, ACCURACY)
    with pytest.raises(UsageError, match="bits per byte"):
        check_target(-1.0, BITS_PER_BYTE)


def test_calibration_is_measured_once_per_setting_and_kept(tmp_path, monkeypatch):
    from lowband import config as C
    from lowband.comparison import calibrate
    from lowband.training.runconfig import method_configs

    cfg = C.from_dict({"data": {"name": "text", "max_bytes": 20000, "context": 16},
                       "model": {"name": "gpt", "size": "nano"}, "optim": {"name": "adamw", "lr": 0.001}},
                      method_configs())
    measured = calibrate.measure(cfg, steps=3, warmup=1)
    assert 0 < measured < 5.0
    calls = []
    monkeypatch.setattr(calibrate, "measure", lambda c: calls.append(c) or 0.25)
    assert calibrate.step_seconds(cfg, str(tmp_path)) == 0.25
    assert calibrate.step_seconds(cfg, str(tmp_path)) == 0.25 and len(calls) == 1  # kept in calibration.json
    other = C.from_dict({**C.to_dict(cfg), "train": {"batch_size": 4}}, method_configs())
    assert calibrate.step_seconds(other, str(tmp_path)) == 0.25 and len(calls) == 2  # another batch: measured
    assert len(calibrate.read(str(tmp_path / "calibration.json"))) == 2


def test_a_target_is_set_in_the_workloads_own_metric(capsys):
    from lowband.cli import main

    assert main(["train", "--dataset", "text", "--model", "gpt", "--set", "train.target_accuracy=0.5"]) == 2
    assert "set train.target_bpb instead" in capsys.readouterr().err
    assert main(["train", "--set", "train.target_bpb=2.0"]) == 2
    assert "set train.target_accuracy instead" in capsys.readouterr().err
    assert main(["train", "--set", "train.stop_at_target=true"]) == 2
    assert "needs train.target_accuracy > 0, train.target_bpb > 0" in capsys.readouterr().err


@pytest.mark.parametrize("metric", [BITS_PER_BYTE, BITS_PER_BYTE.with_margin(0.05)])
def test_a_loss_metric_with_any_margin_writes_bits_per_byte_beside_the_loss(tmp_path, metric):
    reporter = EpochReporter(Communicator(), RunDir(str(tmp_path), 0), logging.getLogger("t"), 1, metric=metric)
    rank = RankFigures(1.0, 8, 8, test_acc=0.5, val_acc=0.5, test_loss=2 * math.log(2), val_loss=math.log(2))
    record = reporter.record(1, [rank], None)
    assert (record.val_bpb, record.test_bpb) == pytest.approx((1.0, 2.0))
    assert EpochReporter(Communicator(), RunDir(str(tmp_path), 0), logging.getLogger("t"), 1).record(
        1, [rank], None).val_bpb is None  # accuracy: no bits per byte
