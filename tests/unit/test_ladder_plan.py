"""benchmarks/ladder.py's protocol, on records written here: what it chooses on seed 0, which runs it judges
on which seeds (a family tried again is judged on seeds 13-15, paired with Allreduce there), and that a run
two families share is planned and listed once."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest

pytestmark = pytest.mark.unit

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


@pytest.fixture
def lad(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    sys.modules.pop("ladder", None)
    import ladder

    monkeypatch.setattr(ladder, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(ladder, "LM_STUDY", str(tmp_path / "lm_study"))
    monkeypatch.setattr(ladder, "CSV", str(tmp_path / "ladder.csv"))
    monkeypatch.setitem(ladder.PARAMS, "small", 834_304)
    return ladder


def finish(lad, job, bpb: float, sent: float = 1e6) -> None:
    """Write a finished run's committed records (EPOCHS epochs, the last with `bpb`)."""
    path = lad.kept_path(job)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for e in range(1, lad.EPOCHS + 1):
            f.write(json.dumps({"epoch": e, "val_bpb": bpb + (lad.EPOCHS - e) * 0.1, "train_loss": 1.0,
                                "bytes_sent_per_worker": sent * e / lad.EPOCHS}) + "\n")


def run_queue(lad, out: str, score) -> list:
    """Finish every job the queue asks for, in order, scored by `score(job)`; the jobs in the order run."""
    ran = []
    while (job := lad.next_job(["small"], out)) is not None:
        assert job not in ran, f"{job} asked for twice"
        finish(lad, job, score(job), 1e6 if job.spec != "allreduce" else 1e9)
        ran.append(job)
    return ran


def test_the_queue_chooses_on_seed_0_brackets_and_judges_a_retry_on_its_own_seeds(lad, tmp_path):
    def score(job):  # Allreduce best at 0.008; every saver best at 0.016 (the own family brackets up to it)
        return 1.7 + abs(job.lr - (0.008 if job.spec == "allreduce" else 0.016)) + (0.01 if "tau=16" in job.spec else 0)

    ran = run_queue(lad, str(tmp_path / "runs"), score)
    by_seed = {s: {(j.spec, j.lr) for j in ran if j.seed == s} for s in (0, 10, 13)}
    ref = ("allreduce", 0.008)
    own = lad.chosen(lad.family_named("sparseloco-1000x-own"), "small", str(tmp_path / "runs"))
    first = lad.chosen(lad.family_named("sparseloco-1000x"), "small", str(tmp_path / "runs"))
    assert own is not None and first is not None
    assert first.lr == 0.016 == own.lr  # the first follows SparseLoCo's rate; the retry found its own
    assert own.spec == lad.PUSH[1]  # tau 8 at 1/128 (tau 16 scored worse)
    assert ref in by_seed[10] and ref in by_seed[13]  # Allreduce paired on both sets of held-out seeds
    assert (own.spec, own.lr) in by_seed[13] and (own.spec, own.lr) not in by_seed[10] - {(first.spec, first.lr)}
    assert all(j.seed in (0, 1, 2, 10, 11, 12) for j in ran if j.spec == lad.S8)  # the saver: 10-12 only
    verdicts = {v.family: v for v in lad.verdicts("small", str(tmp_path / "runs"))}
    assert verdicts["sparseloco-1000x-own"].seeds == (13, 14, 15) and len(verdicts["sparseloco-1000x-own"].paired()) == 3
    assert lad.write_csv(["small"], str(tmp_path / "runs")) == len(ran)  # each run one row, shared ones once
    assert lad.family_of(lad.Job("small", own.spec, own.lr, 13)) == "sparseloco-1000x-own"


def test_sigterm_stops_every_run_it_started_and_starts_no_more(lad, tmp_path, monkeypatch):
    """The queue passes SIGTERM on to its runs (each stops its workers and keeps a checkpoint); without
    it a run goes on, orphaned, after the queue has ended. Then no further run starts."""
    import signal
    import subprocess
    import threading

    monkeypatch.setattr(lad, "STOPPING", threading.Event())
    run = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\nprint('ready', flush=True)\n"
                            "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    lad.LIVE.add(run)
    try:
        assert run.stdout is not None and run.stdout.readline() == "ready\n"  # its handler is in place
        lad.stop_runs(signal.SIGTERM, None)
        assert run.wait(timeout=20) == 7  # the run saw SIGTERM (its own handler's exit code)
    finally:
        lad.LIVE.discard(run)
        run.kill()
    started = []
    monkeypatch.setattr(lad, "train", lambda job, out: started.append(job))
    for parallel in (1, 3):
        lad.run_queue(["small"], str(tmp_path / "runs"), parallel)
    assert started == []
    assert lad.next_job(["small"], str(tmp_path / "runs")) is not None  # there was work left to refuse


def test_kept_records_say_where_they_trained(lad, tmp_path):
    """A kept record names its device ("cpu" or the GPU) and its precision (fp32 when its config says none),
    and ladder.csv lists both: a pair may mix devices, never precisions."""
    job = lad.next_job(["small"], str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / job.size / job.name
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text('[train]\ndevice = "cpu"\n')
    with open(run_dir / "metrics.jsonl", "w") as f:
        for e in range(1, lad.EPOCHS + 1):
            f.write(json.dumps({"epoch": e, "val_bpb": 1.8, "bytes_sent_per_worker": 1e9, "bytes": {}}) + "\n")
    lad.keep(job, str(tmp_path / "runs"), 0, str(run_dir))
    with open(lad.kept_path(job)) as f:
        kept = [json.loads(line) for line in f]
    assert [r["device"] for r in kept] == ["cpu"] * lad.EPOCHS and all("bytes" not in r for r in kept)
    assert [r["precision"] for r in kept] == ["fp32"] * lad.EPOCHS
    lad.write_csv(["small"], str(tmp_path / "runs"))
    with open(lad.CSV) as f:
        row = next(csv.DictReader(f))
    assert (row["device"], row["precision"]) == ("cpu", "fp32")


def test_families_limits_the_queue_to_those_named(lad, tmp_path, monkeypatch):
    """--families diloco: the queue chooses, judges and runs the in-sample seeds of DiLoCo alone."""
    monkeypatch.setattr(lad, "ONLY", {"diloco"})
    ran = run_queue(lad, str(tmp_path / "runs"), lambda job: 1.7 + abs(job.lr - 0.008))
    assert ran and {j.spec for j in ran} == {lad.DILOCO}
    assert {j.seed for j in ran} == {0, *lad.HELD_OUT, *lad.IN_SAMPLE}
