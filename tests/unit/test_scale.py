"""What a report says of its model's size (lowband.comparison.scale), against the ladder's own records."""

from __future__ import annotations

import csv
import os
import statistics

import pytest

from lowband.comparison.scale import ladder, pool_note, pools, scale_note
from lowband.comparison.summary import SummaryRow
from lowband.data.metric import ACCURACY, BITS_PER_BYTE
from lowband.records import EpochRecord

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOUND = {"workload": "GPT on the whole KJV", "sizes": [
    {"size": "nano", "params": 22_176, "methods": [
        {"method": "sparseloco", "fewer_bytes": 579.9, "gap_pct": 2.5, "seeds": "held-out 10-12"}]},
    {"size": "small", "params": 834_304, "methods": [
        {"method": "sparseloco", "fewer_bytes": 579.2, "gap_pct": -0.3, "seeds": "held-out 10-12"},
        {"method": "sparseloco-1000x", "fewer_bytes": 1157.9, "gap_pct": 0.77, "seeds": "in-sample (1 seed)"}]},
    {"size": "medium", "params": 2_700_000, "methods": []}]}


def run(params: int | None, bpb: float | None = 1.8) -> SummaryRow:
    record = EpochRecord(epoch=4, val_bpb=bpb, val_acc=None if bpb else 0.9, params=params)
    metric = BITS_PER_BYTE if bpb else ACCURACY
    return SummaryRow(label="allreduce", method="allreduce", workers=4, records=[record], metric=metric)


def test_a_language_models_report_quotes_each_size_and_names_the_nearest():
    [line] = scale_note([run(300_000)], FOUND)
    assert "nano (22,176 parameters): sparseloco +2.50% at 579x fewer bytes (held-out 10-12)" in line
    assert "sparseloco-1000x +0.77% at 1,157x fewer bytes (in-sample (1 seed))" in line  # rounded down, never up
    assert "medium" not in line  # a size without verdicts is not quoted
    assert line.endswith("This comparison's model has 300,000 parameters, nearest to small.")  # log scale: 300k
    assert scale_note([run(30_000)], FOUND)[0].endswith("nearest to nano.")


def test_other_workloads_and_an_empty_ladder_say_nothing():
    assert scale_note([run(5_000, bpb=None)], FOUND) == []
    assert scale_note([run(300_000)], {}) == []
    assert "nearest" not in scale_note([run(None)], FOUND)[0]  # records from before the count: no size claimed


def test_the_packaged_ladder_agrees_with_the_committed_runs():
    """Every gap and ratio the report quotes is recomputed from benchmarks/results/ladder.csv, the records
    of the runs themselves (the means over the seeds it names, held out or in-sample), with Allreduce at
    its chosen rate (its best on seed 0)."""
    with open(os.path.join(ROOT, "benchmarks", "results", "ladder.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["epochs"] == "4"]
    quoted = [(s["size"], m) for s in ladder()["sizes"] for m in s["methods"]]
    assert quoted, "ladder.json quotes nothing"
    for size, m in quoted:
        seeds = tuple(map(str, m["seed_list"]))
        here = [r for r in rows if r["size"] == size and r["seed"] in seeds]
        ref_lr = min((r for r in rows if r["size"] == size and r["method"] == "allreduce" and r["seed"] == "0"),
                     key=lambda r: float(r["val_bpb"]))["lr"]
        ref = [r for r in here if r["method"] == "allreduce" and r["lr"] == ref_lr]
        mine = [r for r in here if r["spec"] == m["spec"] and r["lr"] == f"{m['lr']:g}"]
        assert len(ref) == len(mine) == len(seeds), (size, m["method"])

        def mean(runs: list[dict], key: str) -> float:
            return statistics.mean(float(r[key]) for r in runs)

        assert 100 * (mean(mine, "val_bpb") / mean(ref, "val_bpb") - 1) == pytest.approx(m["gap_pct"], abs=0.006)
        ratio = mean(ref, "bytes_sent_per_worker") / mean(mine, "bytes_sent_per_worker")
        assert m["fewer_bytes"] <= ratio + 1e-9 < m["fewer_bytes"] + 0.1, (size, m["method"])  # a tenth, rounded down


def test_the_lm_small_suite_runs_what_the_ladder_chose_at_small():
    """`--suite lm-small` is the ladder's verdict at `small` for users: each of its methods is a setting the
    ladder ran at that size, at the rate the ladder chose (its best on seed 0 where the rate was bracketed;
    tau 8's rate for the 1,000x setting, the ladder's rule), and its workload is the ladder's."""
    from lowband.comparison.plan import parse_spec
    from lowband.comparison.request import load_suite

    suite = load_suite("lm-small")
    cfg = suite["config"]
    assert (cfg["model"]["size"], cfg["data"]["max_bytes"], cfg["train"]["workers"], cfg["train"]["epochs"]) == ("small", 0, 4, 4)
    with open(os.path.join(ROOT, "benchmarks", "results", "ladder.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["size"] == "small" and r["seed"] == "0"]
    for label in suite["methods"]:
        name = parse_spec(label)[0]
        ran = [r for r in rows if parse_spec(r["spec"]) == parse_spec(label)]
        assert ran, f"{label}: the ladder never ran it at small"
        lr = suite["per_method"][name]["optim"]["lr"]
        if len({r["lr"] for r in ran}) > 1:  # bracketed: the suite takes the best rate
            assert float(min(ran, key=lambda r: float(r["val_bpb"]))["lr"]) == lr, label
        else:
            assert float(ran[0]["lr"]) == lr, label


POOLS = {"workload": "GPT on the KJV", "cells": [
    {"size": "tiny", "params": 220_544, "workers": 4, "epochs": 4, "methods": [
        {"method": "sparseloco", "gap_pct": 2.01, "train_gap_pct": 3.88, "fewer_bytes": 577.3, "seeds": "held-out 10-12"}]},
    {"size": "tiny", "params": 220_544, "workers": 4, "epochs": 1, "methods": [
        {"method": "sparseloco", "gap_pct": 10.46, "train_gap_pct": 11.75, "fewer_bytes": 577.3, "seeds": "held-out 10-12",
         "seed_gaps_pct": [8.95, 10.53, 11.92]}]},
    {"size": "small", "params": 834_304, "workers": 16, "epochs": 1, "methods": [
        {"method": "sparseloco", "gap_pct": 5.0, "train_gap_pct": 6.0, "fewer_bytes": 560.0, "seeds": "held-out 10-12"}]},
    {"size": "small", "params": 834_304, "workers": 2, "epochs": 1, "methods": []}]}


def pool_run(params: int, workers: int, epochs: int, method: str = "sparseloco") -> SummaryRow:
    record = EpochRecord(epoch=epochs, val_bpb=1.8, params=params)
    return SummaryRow(label=method, method=method, workers=workers, records=[record], metric=BITS_PER_BYTE)


@pytest.mark.parametrize("params, workers, epochs, cell", [
    (220_544, 4, 4, "tiny with 4 workers and 4 epochs"),
    (220_544, 4, 1, "tiny with 4 workers and 1 epoch "),
    (900_000, 12, 1, "small with 16 workers and 1 epoch "),  # nearest by size, workers and epochs together
    (800_000, 2, 1, "tiny with 4 workers and 1 epoch "),  # a cell without verdicts is never quoted
])
def test_a_report_quotes_the_worker_axis_cell_nearest_its_size_workers_and_epochs(params, workers, epochs, cell):
    [line] = pool_note([pool_run(params, workers, epochs), pool_run(params, 1, epochs, "single")], POOLS)
    assert f"nearest the worker-axis cell {cell}" in line
    said = f"{epochs} epoch" + "s" * (epochs > 1)
    assert f"({params:,} parameters, {workers} workers, {said})" in line  # single's one worker aside
    if cell.startswith("tiny with 4 workers and 1"):
        assert ("sparseloco +10.46% (training loss +11.75%; by seed: +8.95, +10.53, +11.92%) at 577x fewer bytes "
                "(held-out 10-12)") in line
    elif cell.startswith("small"):  # a summary without the per-seed gaps (an older release's) still reads
        assert "sparseloco +5.00% (training loss +6.00%) at 560x" in line


def test_no_pool_is_quoted_for_another_workload_or_without_cells():
    assert pool_note([pool_run(220_544, 4, 1)], {}) == []
    accuracy = SummaryRow(label="a", method="allreduce", workers=4, metric=ACCURACY,
                          records=[EpochRecord(epoch=1, val_acc=0.9, params=5_000)])
    assert pool_note([accuracy], POOLS) == []


def test_the_packaged_worker_axis_agrees_with_the_committed_runs():
    """Every gap workers.json quotes is recomputed from the committed runs: workers.csv for the worker-axis
    cells (the mean over the seeds it names against Allreduce's on the same seeds), and the ladder's own
    summary for its 4-worker, 4-epoch cells."""
    with open(os.path.join(ROOT, "benchmarks", "results", "workers.csv")) as f:
        rows = [r for r in csv.DictReader(f) if int(r.get("batch") or 16) == 16]  # workers.json: batch 16 only
    by_size = {s["size"]: {m["method"]: m for m in s["methods"]} for s in ladder()["sizes"]}
    cells = pools()["cells"]
    assert cells, "workers.json quotes nothing"
    for cell in cells:
        for m in cell["methods"]:
            if (cell["workers"], cell["epochs"]) == (4, 4):
                assert m["gap_pct"] == by_size[cell["size"]][m["method"]]["gap_pct"]
                continue
            seeds = m["seeds"].removeprefix("held-out seeds ").split(", ")
            here = [r for r in rows if (r["size"], int(r["workers"]), int(r["epochs"])) ==
                    (cell["size"], cell["workers"], cell["epochs"]) and r["seed"] in seeds]
            mine = [float(r["val_bpb"]) for r in here if r["method"] == m["method"] and float(r["lr"]) == m["lr"]]
            ref_lr = min((r for r in here if r["method"] == "allreduce"), key=lambda r: float(r["val_bpb"]))["lr"]
            ref = [float(r["val_bpb"]) for r in here if r["method"] == "allreduce" and r["lr"] == ref_lr]
            assert len(mine) == len(ref) == len(seeds) >= 3
            assert m["gap_pct"] == pytest.approx(100 * (statistics.mean(mine) / statistics.mean(ref) - 1), abs=0.006)
            by_seed = {r["seed"]: float(r["val_bpb"]) for r in here if r["method"] == m["method"] and float(r["lr"]) == m["lr"]}
            ref_seed = {r["seed"]: float(r["val_bpb"]) for r in here if r["method"] == "allreduce" and r["lr"] == ref_lr}
            per_seed = [100 * (by_seed[s] / ref_seed[s] - 1) for s in sorted(seeds, key=int)]
            assert m["seed_gaps_pct"] == pytest.approx(per_seed, abs=0.006)
