"""The comparison table from hand-made runs: one reference, seeds pooled, noise marked, zero bytes."""

import statistics
from dataclasses import replace

import pytest

from lowband.comparison import table
from lowband.comparison.summary import SummaryRow
from lowband.records import EpochRecord


def rec(epoch, val, sent, secs, test=None, samples=1000):
    return EpochRecord(epoch=epoch, val_acc=val, test_acc=val if test is None else test, val_acc_L=val,
                       bytes_sent_per_worker=sent, samples=samples * epoch, time={"train_s": secs})


def run(label, vals, sent_per_epoch, secs_per_epoch, method=None, status="ok", tests=None):
    records = [rec(e, v, sent_per_epoch * e, secs_per_epoch * e, None if tests is None else tests[e - 1])
               for e, v in enumerate(vals, 1)]
    return SummaryRow(label=label, method=method or label.split(":")[0], workers=4, status=status, records=records)


RUNS = [
    run("allreduce", [0.80, 0.88, 0.90], 1e6, 10),
    run("allreduce", [0.82, 0.90, 0.92], 1e6, 12),
    # reaches 0.91 on the mean curve at epoch 3 only: seed 0 at 2, seed 1 at 3 (means .825 .895 .93)
    run("local_sgd:tau=16", [0.85, 0.95, 0.95], 1e4, 5),
    run("local_sgd:tau=16", [0.80, 0.84, 0.91], 1e4, 5),
    # final mean 0.90 (-1 pt) but seeds 0.87 / 0.93: within noise
    run("ec_dnn", [0.70, 0.80, 0.87], 5e4, 6),
    run("ec_dnn", [0.70, 0.80, 0.93], 5e4, 6),
    # sends nothing; its test accuracy reaches the target, its validation accuracy never does
    run("single", [0.50, 0.60, 0.70], 0.0, 8, tests=[0.95, 0.95, 0.95]),
    run("single", [0.50, 0.60, 0.72], 0.0, 8, tests=[0.95, 0.95, 0.95], status="failed (1)"),
]


def by_label(rows):
    return {r.label: r for r in rows}


def test_reference_is_allreduces_mean_final_validation_accuracy():
    rows, target, why = table.rows(RUNS)
    assert target == pytest.approx(0.91) and why == "mean final validation accuracy of allreduce over 2 seeds"
    ar = by_label(rows)["allreduce"]
    assert ar.val_acc.mean == pytest.approx(0.91) and ar.val_acc.sd == pytest.approx(statistics.stdev([.9, .92]))
    assert ar.epochs_to_target == 3 and ar.seconds_to_target == pytest.approx(33.0)  # mean of 30 and 36
    assert ar.speedup == pytest.approx(1.0)


def test_reaching_is_decided_on_the_mean_curve():
    local = by_label(table.rows(RUNS)[0])["local_sgd:tau=16"]
    assert local.epochs_to_target == 3 and local.bytes_to_target == pytest.approx(3e4)
    assert local.seconds_to_target == pytest.approx(15.0) and local.speedup == pytest.approx(33.0 / 15.0)


def test_a_gap_smaller_than_the_spread_is_marked_within_noise():
    rows = by_label(table.rows(RUNS)[0])
    ec = rows["ec_dnn"]
    assert ec.gap == pytest.approx(-0.01) and ec.within_noise and ec.epochs_to_target is None
    local = rows["local_sgd:tau=16"]  # reaches the target, by +2 pts, but its seeds spread by 2.8
    assert local.gap == pytest.approx(0.02) and local.within_noise
    assert rows["single"].gap == pytest.approx(-0.20) and not rows["single"].within_noise
    text = table.text(list(rows.values()))
    assert "-1.00 pts (within noise)" in text and "+2.00 pts (within noise)" in text and "-20.00 pts " in text


def test_to_target_reads_validation_and_zero_bytes_show_as_zero():
    single = by_label(table.rows(RUNS)[0])["single"]
    assert single.test_acc.mean == pytest.approx(0.95) and single.epochs_to_target is None
    assert single.bytes.mean == 0.0 and single.status == "1 of 2 failed"
    cells = dict(zip(table.head([single]), table.cells(single, len(table.head([single]))), strict=True))
    assert cells["sent/worker"] == "0 B" and cells["seconds to target"] == "never" and cells["status"] == "1 of 2 failed"
    assert cells["val acc"] == "0.7100 ± 0.0141" and cells["test acc"] == "0.9500 ± 0.0000"
    reached = table.rows(RUNS, target=0.6)[0]
    assert by_label(reached)["single"].bytes_to_target == 0.0
    assert by_label(reached)["single"].speedup == pytest.approx(11.0 / 16.0)  # allreduce hits 0.6 at epoch 1


def test_a_given_target_wins_and_one_seed_has_no_spread():
    rows, target, why = table.rows(RUNS[:1] + RUNS[2:3], target=0.85)
    assert (target, why) == (0.85, "given")
    local = by_label(rows)["local_sgd:tau=16"]
    assert local.val_acc.sd is None and not local.within_noise and local.epochs_to_target == 1
    assert table.Stat.of([]) is None


def test_no_allreduce_no_target():
    rows, target, why = table.rows(RUNS[2:4])
    assert target is None and why.startswith("none") and rows[0].gap is None


def test_console_and_markdown_render_the_same_cells():
    rows = table.rows(RUNS)[0]
    md = table.markdown(rows)
    lines = table.text(rows).splitlines()
    assert len(md) == len(lines) == 2 + 4
    for md_line, text_line, r in zip(md[2:], lines[2:], rows, strict=True):
        cells = [c.strip() for c in md_line.strip("|").split("|")]
        assert cells == table.cells(r, len(table.head(rows)))
        assert all(c in text_line for c in cells)


def test_runs_with_sites_show_inter_site_bytes_per_worker():
    sited = [replace(r, sites=2) for r in RUNS[:2]]
    for r in sited:
        r.records = [replace(x, bytes_inter_per_worker=x.bytes_sent_per_worker / 4) for x in r.records]
    assert table.INTER not in table.text(table.rows(RUNS)[0])  # no sites: no column
    rows = table.rows(sited + RUNS[2:4])[0]
    cells = dict(zip(table.head(rows), table.cells(rows[0], len(table.head(rows)), table.columns(rows)), strict=True))
    assert cells["sent/worker"] == table.human_bytes(3e6) and cells[table.INTER] == table.human_bytes(7.5e5)
    assert table.markdown(rows)[0].count(table.INTER) == 1


def test_a_spec_option_that_tuning_replaced_is_shown_as_it_ran():
    assert table.retuned("diloco:tau=16", "optim.lr=0.002 method.tau=16") == ""  # the spec's own value won
    assert table.retuned("diloco", "method.tau=32") == "" and table.retuned("diloco:tau=16", None) == ""
    assert table.retuned("diloco:codec=topk:0.02+int2:tau=16", "method.tau=32") == "tau=32"  # a value with colons
    assert table.retuned("diloco:outer_lr=1.0", "method.outer_lr=1") == ""  # the same number, written twice
    assert table.retuned("diloco:tau=16", "optim.lr=0.002 method.tau=32") == "tau=32"
    tuned = replace(run("diloco:tau=16", [0.7], 5, 1), tuned="method.tau=32")
    assert table.text(table.rows([tuned])[0]).splitlines()[2].startswith("diloco:tau=16 (tuned: tau=32)")
