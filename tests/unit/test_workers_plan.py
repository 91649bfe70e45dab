"""benchmarks/workers.py's protocol, on records written here: each family's rate bracketed on seed 0 (the
bracket grows past an edge, at most MAX_RATES rates), the chosen rate alone judged on seeds 10-12, the
choosing seed in no judged figure, and the report's gaps (mean and per seed) against a computation of
their own (the 95% interval against NumPy and a t table). Run on the goal cell with its third family (sparseloco-256)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.unit

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
BEST = {"allreduce": 0.008, "sparseloco": 0.004, "sparseloco-256": 0.016}  # each family's best rate


@pytest.fixture
def wk(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("workers", None)
    import workers

    monkeypatch.setattr(workers, "RESULTS", str(tmp_path / "results"))
    return workers


def score(job) -> float:
    """A family's final val bpb: best at its BEST rate, worse by the distance in octaves; seeds differ."""
    import math

    return 3.0 + abs(math.log2(job.lr / BEST[job.family])) * 0.1 + job.seed * 0.001 + (job.family != "allreduce") * 0.05


def finish(job, bpb: float) -> None:
    """Write a finished run's committed records: its cell's epochs, the last with `bpb`."""
    os.makedirs(os.path.dirname(job.kept), exist_ok=True)
    sent = 1e9 if job.family == "allreduce" else 2e6
    with open(job.kept, "w") as f:
        for e in range(1, job.cell.epochs + 1):
            f.write(json.dumps({"epoch": e, "val_bpb": bpb + (job.cell.epochs - e), "train_loss": bpb / 2,
                                "bytes_sent_per_worker": sent * e / job.cell.epochs}) + "\n")


def test_the_queue_brackets_on_seed_0_then_judges_the_chosen_rate_on_held_out_seeds(wk, tmp_path):
    cell = wk.Cell("small", 16, 1, ("allreduce", "sparseloco", "sparseloco-256"))
    out, ran = str(tmp_path / "runs"), []
    while (job := wk.next_job([cell], out)) is not None:
        assert job not in ran, f"{job} asked for twice"
        finish(job, score(job))
        ran.append(job)
    rates = {f: sorted(j.lr for j in ran if j.family == f and j.seed == 0) for f in cell.families}
    assert rates["allreduce"] == [0.004, 0.008, 0.016]  # best at its start's top edge: one past it, then inside
    assert rates["sparseloco"] == [0.002, 0.004, 0.008, 0.016]  # from (0.008, 0.016) down, MAX_RATES rates in all
    assert rates["sparseloco-256"] == [0.004, 0.008, 0.016, 0.032]  # from (0.004, 0.008) up past its best
    for family in cell.families:
        chosen = wk.chosen(cell, family, out)
        assert chosen is not None and chosen.lr == BEST[family]
        held = sorted(j.seed for j in ran if j.family == family and j.seed != 0)
        assert held == list(wk.HELD_OUT) and {j.lr for j in ran if j.family == family and j.seed != 0} == {chosen.lr}
    rows = {r.family: r for r in wk.rows(cell, out)}
    assert 0 not in rows["sparseloco-256"].held  # the choosing seed informs no figure
    ref = {s: score(wk.Job(cell, "allreduce", BEST["allreduce"], s)) for s in wk.HELD_OUT}
    mine = {s: score(wk.Job(cell, "sparseloco-256", BEST["sparseloco-256"], s)) for s in wk.HELD_OUT}
    expect = [100 * (mine[s] / ref[s] - 1) for s in wk.HELD_OUT]
    assert rows["sparseloco-256"].seed_gaps() == pytest.approx(expect)
    half = 4.302653 * np.std(expect, ddof=1) / np.sqrt(3)  # Student's t, 2 degrees of freedom, 97.5% (a table's)
    assert rows["sparseloco-256"].interval() == pytest.approx((np.mean(expect) - half, np.mean(expect) + half))
    assert rows["sparseloco-256"].gap("val_bpb") == pytest.approx(100 * (sum(mine.values()) / sum(ref.values()) - 1))
    assert rows["sparseloco-256"].ratio() == pytest.approx(500.0)  # 1e9 / 2e6 bytes a worker
    assert rows["sparseloco-256"].spread() == pytest.approx(max(mine.values()) - min(mine.values()))  # 0.002
    assert rows["allreduce"].spread() == pytest.approx(max(ref.values()) - min(ref.values()))


def test_a_cell_of_another_batch_trains_with_it_under_its_own_name(wk, tmp_path):
    """The goal cell at K = 4's global batch: its runs ask lowband for 4 windows a worker (the last
    --batch-size wins over the ladder's 16), live in their own folders, and the ladder's batch names no cell."""
    b4, b16 = wk.Cell("small", 16, 1, batch=4), wk.Cell("small", 16, 1)
    assert (b4.name, b16.name) == ("small-k16-e1-b4", "small-k16-e1")
    args = wk.command(wk.Job(b4, "allreduce", 0.004, 0), str(tmp_path / "run"))
    last = len(args) - 1 - args[::-1].index("--batch-size")
    assert args[last + 1] == "4" and args[args.index("--workers") + 1] == "16"
    assert "train.eval_ranks=1" in args  # the run's figures do not depend on it (tests/distributed/test_many_workers)
    assert wk.Job(b4, "allreduce", 0.004, 0).kept != wk.Job(b16, "allreduce", 0.004, 0).kept


def test_the_scaled_family_is_the_ladders_setting_at_4_workers(wk, tmp_path):
    """The outer lr of `sparseloco-scaled` is 0.75 K: at K = 4 it is the ladder's own setting (its K = 4 point is
    the ladder's runs), at K = 16 the command asks for outer lr 12, and the run has a name of its own."""
    import ladder

    assert wk.spec("sparseloco-scaled", 4) == ladder.S8
    k16 = wk.Job(wk.Cell("tiny", 16, 4), "sparseloco-scaled", 0.016, 0)
    assert "method.outer_lr=12.0" in wk.command(k16, str(tmp_path / "run"))
    assert "outer_lr-12.0" in k16.name and wk.spec("sparseloco-scaled", 8).endswith("outer_lr=6.0")


def test_a_cell_still_choosing_is_in_the_table_only(wk, tmp_path, monkeypatch):
    """A cell whose savers have run only on the choosing seed prints its rows, marked "chose it", but is not
    judged: workers.json quotes the held-out cell alone, and the figure has no point for it."""
    done = wk.Cell("small", 16, 1, ("allreduce", "sparseloco"))
    choosing = wk.Cell("small", 8, 1, ("allreduce", "sparseloco"))
    out = str(tmp_path / "runs")
    while (job := wk.next_job([done], out)) is not None:
        finish(job, score(job))
    while (job := wk.next_job([choosing], out)) is not None and job.seed == 0:  # the bracket, not the judging
        finish(job, score(job))
    assert [wk.judged(r) for r in wk.rows(choosing, out)] == [False, False]
    tables = []
    monkeypatch.setattr(wk, "plot", lambda table, figure: tables.append(table))
    wk.publish_to(str(tmp_path / "report"), publish=False)
    wk.report([done, choosing], out, str(tmp_path / "report" / "workers.png"))
    with open(tmp_path / "report" / "workers.json") as f:
        assert [c["workers"] for c in json.load(f)["cells"]] == [16]
    assert [k for k, _, _ in wk.points(tables[0], "small", 1, "sparseloco")] == [16]
    assert any(c.workers == 8 and r.family == "sparseloco" for c, r in tables[0])  # in the table all the same
