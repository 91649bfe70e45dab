"""The worker axis and the regime without repetition (issue 64): how far SparseLoCo's and DiLoCo's loss is
from Allreduce's when the pool has 2 to 16 workers, and when no training window is seen twice.

A cell is (GPT size, workers K, epochs E). The workload is the scale ladder's (benchmarks/ladder.py):
byte-level GPT, the whole KJV (80/10/10), context 64, AdamW with a quarter-epoch warm-up and cosine decay.

How the batch moves with K: **each worker keeps the ladder's batch of 16 windows**, so the global batch
is 16K and, for the same samples (E epochs of the training split), each worker takes 1/K of the steps.
That is a user with a fixed budget who adds machines: each machine does less, the global batch grows, and
Allreduce takes fewer, larger steps. The scaling-law paper (Charles et al. 2025) holds the token budget and
tunes the batch; here the rate is re-chosen per cell instead (a larger batch wants a larger rate). One cell,
`small-k16-e1-b4`, holds K = 4's global batch instead (4 windows a worker, the same 840 steps as small-k4-e1),
so that the number of replicas is the one thing that differs; it stays out of workers.json and the figure.

E = 1 is the regime without repetition: every training window is seen once, as in LLM pre-training.

Each epoch the global model is evaluated, and (from 2026-11-29) only rank 0's and the lowest training loss's
own models besides (`train.eval_ranks=1`): the run's figures are the same as with every rank evaluating
(tests/distributed/test_many_workers.py), and evaluation took 42-47% of a K = 8 or 16 run's wall time.

SparseLoCo's outer lr: the `sparseloco` family keeps the ladder's 3 at every K, as the issue asked. Since the
mean over K workers divides a coordinate that about one worker sent by K, an outer lr that grows with K was
tried (`sparseloco-scaled`, 0.75 K): at K = 16 (12) it blew up. `sparseloco-senders` divides each coordinate
by its senders instead, a rule without K: at K = 16 it ends with outer lr 3's mean on the held-out seeds
(+6.06% from Allreduce against +6.62%), steadier (no slow seed) but behind it on two seeds of three.

The protocol is the ladder's: in every cell each family's rate is bracketed on seed 0 (starting from its
chosen rate at K = 4, E = 4, and the neighbour the batch or the shorter run points to), then the chosen
rate is judged on seeds 10, 11 and 12, which informed no choice. K = 4, E = 4 is the ladder's own cell:
its records are read from benchmarks/results/ladder/, not run again.

Run:     python benchmarks/workers.py --run [--cells tiny-k4-e1,small-k16-e1] [--families F,...] [--out runs/workers]
Plan:    python benchmarks/workers.py --plan
Report:  python benchmarks/workers.py --report [--publish] [--figure PNG]
         (the table; workers.csv, workers.json and workers.png into --out; --publish writes them where
         they are committed instead: benchmarks/results/workers.csv and workers.json, from
         which every language-model report quotes the measured cell nearest its size, workers and
         epochs, and benchmarks/figures/workers.png)
Records: benchmarks/results/workers/CELL/RUN.jsonl (committed, a failed run's with a .failed file) and
         benchmarks/results/workers.csv. SIGTERM stops the queue; the run training resumes next time.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace

from scipy.stats import t as t_dist

import ladder
from common import commit, method_flags

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "workers")
CSV = os.path.join(HERE, "results", "workers.csv")
#: what `lowband compare`'s report quotes of pools (lowband.comparison.scale reads it)
SUMMARY = os.path.join(HERE, "results", "workers.json")  # a release carries it as package data (setup.py)
CHOOSE_SEED, HELD_OUT = 0, (10, 11, 12)
MAX_RATES = 4
MAX_TRIES = 3  # a run that fails for another cause than divergence (a worker killed, a timeout) is tried again
#                at most this often in all, counted in RUN.tries beside its kept records; then it is failed

#: the K = 4, E = 4 choice of each family at each size (the ladder's), where every cell's bracket starts
FAMILIES = {"allreduce": "allreduce", "sparseloco": ladder.S8, "diloco-0.7": ladder.DILOCO_07,
            # the goal's means at 16 workers: messages 4 times smaller, so its all-gather (K - 1 messages a round)
            # sends about what the 1/64 setting sends at K = 4 (about 577x fewer bytes than Allreduce at any K)
            "sparseloco-256": "sparseloco:density=0.00390625:codec=lut2:tau=8:outer_lr=3.0",
            # why DiLoCo falls behind at 16 workers: the same replicas with K = 4's number of rounds (tau 16 / 4)
            "diloco-0.7-tau4": "diloco:tau=4:outer_lr=0.7",
            # the rule docs/choosing.md gave: an outer lr that grows with K (0.75 K, the ladder's 3 at K = 4), since
            # the mean over K divides a coordinate about one worker sent by K. FAILED at K = 16 (outer lr 12: 132
            # bpb after one epoch; a coordinate every worker sent moves 12 times its value): in no cell now
            "sparseloco-scaled": "sparseloco:density=0.015625:codec=lut2:tau=8:outer_lr={outer}",
            # the K-free rule instead: each coordinate's sum divided by its senders, outer lr 1 (docs/choosing.md)
            "sparseloco-senders": "sparseloco:density=0.015625:codec=lut2:tau=8:outer_lr=1.0:mean=senders"}
OUTER_PER_WORKER = 0.75  # the scaled family's outer lr is this times K
LADDER_RATE = {("allreduce", "tiny"): 0.016, ("allreduce", "small"): 0.004,
               ("sparseloco-256", "small"): 0.004,  # not on the ladder: where the 1/64 setting chose at K = 16
               ("diloco-0.7-tau4", "tiny"): 0.016,  # not on the ladder: where tau 16 chose at K = 16
               ("sparseloco-scaled", "tiny"): 0.016, ("sparseloco-senders", "tiny"): 0.016,  # the ladder's (K = 4)
               ("sparseloco", "tiny"): 0.016, ("sparseloco", "small"): 0.008,
               ("diloco-0.7", "tiny"): 0.008, ("diloco-0.7", "small"): 0.004}
BATCH = 16  # the ladder's windows a worker a step
LADDER_SEEDS = {"allreduce": (10, 11, 12), "sparseloco": (10, 11, 12), "diloco-0.7": (13, 14, 15)}


def spec(family: str, workers: int) -> str:
    """The family's method spec at K workers (only the scaled family's depends on K)."""
    return FAMILIES[family].format(outer=f"{OUTER_PER_WORKER * workers:.1f}")  # 3.0 at K = 4, as the ladder writes it


@dataclass(frozen=True)
class Cell:
    size: str
    workers: int
    epochs: int
    families: tuple[str, ...] = ("allreduce", "sparseloco", "diloco-0.7")
    batch: int = BATCH  # windows a worker a step; another batch names the cell -bB and stays out of workers.json

    @property
    def name(self) -> str:
        return f"{self.size}-k{self.workers}-e{self.epochs}" + (f"-b{self.batch}" if self.batch != BATCH else "")

    def start_rates(self, family: str) -> tuple[float, ...]:
        """Where the bracket starts: the ladder's rate and the neighbour a larger global batch or a shorter
        run points to (up), or a smaller batch (down)."""
        r = LADDER_RATE[(family, self.size)]
        return (r / 2, r) if self.workers < 4 else (r, 2 * r)


#: in the order --run takes them: the cheap regime without repetition first, the goal's cell, then the axis
CELLS = (
    Cell("tiny", 4, 1),
    Cell("small", 16, 1, ("allreduce", "sparseloco", "sparseloco-256")),
    Cell("tiny", 16, 4, ("allreduce", "sparseloco", "diloco-0.7", "diloco-0.7-tau4", "sparseloco-senders")),
    Cell("tiny", 8, 4),
    Cell("tiny", 2, 4),
    Cell("small", 4, 1, ("allreduce", "sparseloco")),
    Cell("small", 16, 4),
    # the goal's question where Allreduce's seeds agree: 16 workers with K = 4's global batch (64 windows) and
    # steps (840), so the replicas are the one thing that differs from small-k4-e1
    Cell("small", 16, 1, ("allreduce", "sparseloco-256", "sparseloco"), batch=4),
)


@dataclass(frozen=True)
class Job:
    cell: Cell
    family: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return ladder.Job(self.cell.size, self.spec, self.lr, self.seed).name

    @property
    def spec(self) -> str:
        return spec(self.family, self.cell.workers)

    @property
    def kept(self) -> str:
        return os.path.join(RESULTS, self.cell.name, self.name + ".jsonl")

    def run_dir(self, out: str) -> str:
        return os.path.join(out, self.cell.name, self.name)


def records(job: Job, out: str) -> list[dict]:
    found = [ladder.read_records(p) for p in (os.path.join(job.run_dir(out), "metrics.jsonl"), job.kept)]
    return max(found, key=len)


def failed(job: Job) -> bool:
    return os.path.exists(job.kept[:-len(".jsonl")] + ".failed")


def final(job: Job, out: str) -> dict | None:
    recs = records(job, out)
    return recs[-1] if recs and recs[-1]["epoch"] >= job.cell.epochs else None


def done(job: Job, out: str) -> bool:
    return final(job, out) is not None or failed(job)


def bpb(job: Job, out: str) -> float:
    rec = final(job, out)
    return rec["val_bpb"] if rec and rec.get("val_bpb") is not None else math.inf


# ---- the protocol ----------------------------------------------------------------------------------

def tried(cell: Cell, family: str, out: str) -> list[Job]:
    """The family's choosing runs in `cell`, the bracket's extensions included while all have finished."""
    jobs = [Job(cell, family, lr, CHOOSE_SEED) for lr in cell.start_rates(family)]
    while all(done(j, out) for j in jobs):
        best = min(jobs, key=lambda j: bpb(j, out))
        rates = sorted(j.lr for j in jobs)
        if not math.isfinite(bpb(best, out)) or len(rates) >= MAX_RATES:
            break
        nxt = best.lr * 2 if best.lr == rates[-1] else best.lr / 2 if best.lr == rates[0] else None
        if nxt is None:
            break
        jobs.append(Job(cell, family, round(nxt, 6), CHOOSE_SEED))
    return jobs


def chosen(cell: Cell, family: str, out: str) -> Job | None:
    jobs = tried(cell, family, out)
    if not all(done(j, out) for j in jobs):
        return None
    best = min(jobs, key=lambda j: bpb(j, out))
    return best if math.isfinite(bpb(best, out)) else None


def cell_jobs(cell: Cell, out: str) -> list[Job]:
    """The cell's jobs known now: every family's choosing runs, then the held-out seeds seed by seed."""
    jobs = [j for f in cell.families for j in tried(cell, f, out)]
    picks = [p for f in cell.families if (p := chosen(cell, f, out)) is not None]
    return jobs + [Job(cell, p.family, p.lr, s) for s in HELD_OUT for p in picks]


def next_job(cells: list[Cell], out: str) -> Job | None:
    return next((j for c in cells for j in cell_jobs(c, out) if not done(j, out)), None)


# ---- running -----------------------------------------------------------------------------------------

def command(job: Job, run_dir: str) -> list[str]:
    if os.path.exists(os.path.join(run_dir, "config.toml")):
        return ["--resume", run_dir]
    return [*method_flags(job.spec, round_evals=False), *ladder.BASE, "--batch-size", str(job.cell.batch),
            "--set", f"model.size='{job.cell.size}'", "--workers", str(job.cell.workers), "--epochs", str(job.cell.epochs),
            "--set", f"optim.lr={job.lr}", "--seed", str(job.seed), "--run-dir", run_dir, "--set", "train.eval_ranks=1"]


LIVE: list[subprocess.Popen] = []
STOPPING: list[bool] = []


def train(job: Job, out: str) -> None:
    """One run, resumed if stopped before; its records kept when it ends."""
    run_dir = job.run_dir(out)
    if os.path.isdir(run_dir) and not os.path.exists(os.path.join(run_dir, "checkpoints")):
        shutil.rmtree(run_dir)  # stopped before its first checkpoint: start again
    args = command(job, run_dir)
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] {job.cell.name} {job.family} lr={job.lr:g} seed {job.seed}", flush=True)
    with subprocess.Popen([sys.executable, "-m", "lowband", "train", "-q", *args]) as proc:
        LIVE.append(proc)
        code = proc.wait()
        LIVE.remove(proc)
    print(f"  exit {code} after {time.time() - t0:.0f} s, val bpb {bpb(job, out):.4f}", flush=True)
    if STOPPING:
        return
    recs = ladder.read_records(os.path.join(run_dir, "metrics.jsonl"))
    os.makedirs(os.path.dirname(job.kept), exist_ok=True)
    if recs:
        with open(job.kept, "w") as f:
            for r in recs:
                f.write(ladder.json.dumps({k: v for k, v in r.items() if k != "bytes"}) + "\n")
    if code == 2:
        print(f"lowband refused {job.cell.name} {job.family} lr={job.lr:g} seed {job.seed} (exit 2; its line is "
              "above): fix the request, then --run again", flush=True)
        STOPPING.append(True)
        return
    finished = code == 0 and recs and recs[-1]["epoch"] >= job.cell.epochs
    tries = count_try(job) if not finished and code != 4 else 0
    if code == 4 or (code == 0 and not finished) or tries >= MAX_TRIES:
        cause = ladder.divergence(run_dir) or f"exit {code}" + (f", {tries} tries (MAX_TRIES)" if tries else "")
        with open(job.kept[:-len(".jsonl")] + ".failed", "w") as f:
            f.write(cause + "\n")


def count_try(job: Job) -> int:
    """One more failed try of `job` (RUN.tries beside its kept records); how many so far."""
    path = job.kept[:-len(".jsonl")] + ".tries"
    tries = 1
    if os.path.exists(path):
        with open(path) as f:
            tries += int(f.read().strip() or 0)
    with open(path, "w") as f:
        f.write(f"{tries}\n")
    return tries


def stop(signum: int, frame: object) -> None:
    STOPPING.append(True)
    for proc in LIVE:
        proc.send_signal(signal.SIGTERM)


# ---- what it shows -------------------------------------------------------------------------------

def ladder_final(family: str, size: str, seed: int) -> dict | None:
    """The ladder's K = 4, E = 4 run of `family` at its chosen rate."""
    job = ladder.Job(size, spec(family, 4), LADDER_RATE[(family, size)], seed)
    recs = ladder.read_records(ladder.kept_path(job)) or ladder.read_records(
        os.path.join(ladder.LM_STUDY, job.name + ".jsonl"))
    return recs[-1] if recs and recs[-1]["epoch"] >= ladder.EPOCHS else None


@dataclass
class Row:
    cell: str
    family: str
    lr: float
    held: dict[int, dict]  # seed -> final record
    ref: dict[int, dict]  # Allreduce's, on the same seeds

    def _seeds(self) -> list[int]:
        return [s for s in self.held if s in self.ref]

    def gap(self, key: str) -> float | None:
        seeds = self._seeds()
        if not seeds:
            return None
        return 100 * (statistics.mean(self.held[s][key] for s in seeds)
                      / statistics.mean(self.ref[s][key] for s in seeds) - 1)

    def seed_gaps(self, key: str = "val_bpb") -> list[float]:
        """The gap on each held-out seed, against Allreduce's run on the same seed: the spread a mean hides."""
        return [100 * (self.held[s][key] / self.ref[s][key] - 1) for s in sorted(self._seeds())]

    def interval(self, key: str = "val_bpb") -> tuple[float, float] | None:
        """The 95% interval of the gap (Student's t over the per-seed gaps, each seed paired with Allreduce's
        run on that seed), centred on their mean (a little off the gap of the means the table leads with): a
        gap whose interval holds 0, or 2%, cannot be told from it on these seeds."""
        gaps = self.seed_gaps(key)
        if len(gaps) < 2:
            return None
        half = t_dist.ppf(0.975, len(gaps) - 1) * statistics.stdev(gaps) / math.sqrt(len(gaps))
        return statistics.mean(gaps) - half, statistics.mean(gaps) + half

    def spread(self, key: str = "val_bpb") -> float | None:
        """How far apart this family's own held-out runs end (max - min): beside Allreduce's, it says whose
        noise a wide interval is."""
        values = [self.held[s][key] for s in self._seeds()]
        return max(values) - min(values) if len(values) > 1 else None

    def ratio(self) -> float | None:
        seeds = self._seeds()
        mine = sum(self.held[s]["bytes_sent_per_worker"] for s in seeds)
        return sum(self.ref[s]["bytes_sent_per_worker"] for s in seeds) / mine if seeds and mine else None


def rows(cell: Cell, out: str) -> list[Row]:
    """Each family's chosen rate judged on the held-out seeds, against Allreduce's on the same seeds."""
    if (cell.workers, cell.epochs) == (4, 4):
        ref = {s: r for s in range(10, 16) if (r := ladder_final("allreduce", cell.size, s))}
        return [Row(cell.name, f, LADDER_RATE[(f, cell.size)],
                    {s: r for s in LADDER_SEEDS[f] if (r := ladder_final(f, cell.size, s))}, ref)
                for f in cell.families]
    ref_pick = chosen(cell, "allreduce", out)
    seeds = (CHOOSE_SEED, *HELD_OUT)
    ref = {s: r for s in seeds if ref_pick and (r := final(Job(cell, "allreduce", ref_pick.lr, s), out))}
    found = []
    for f in cell.families:
        pick = chosen(cell, f, out)
        if pick is not None:
            held = {s: r for s in seeds if (r := final(Job(cell, f, pick.lr, s), out))}
            if any(s in held and s in ref for s in HELD_OUT):  # held out: the choosing seed informs no figure
                held.pop(CHOOSE_SEED, None)
            found.append(Row(cell.name, f, pick.lr, held, ref))
    return found


def judged(row: Row) -> bool:
    """Whether a row's figures come from held-out seeds: a cell still choosing (its seed 0 only) is printed in
    the table, marked "chose it", and is in neither workers.json nor the figure."""
    seeds = sorted(s for s in row.held if s in row.ref)
    return bool(seeds) and seeds != [CHOOSE_SEED]


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}%"


def span(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:+.1f} to {interval[1]:+.1f}%"


def report(cells: list[Cell], out: str, figure: str) -> None:
    print(f"Worker axis and the regime without repetition (benchmarks/workers.py, commit {commit()}); "
          "gaps to Allreduce on held-out seeds, validation and last-epoch training loss")
    print("| cell | family | lr | seeds | val bpb | seeds' spread | val gap | per seed | 95% interval | train-loss gap "
          "| fewer bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    table = []
    for cell in cells:
        for row in rows(cell, out):
            seeds = sorted(s for s in row.held if s in row.ref)
            mean = statistics.mean(row.held[s]["val_bpb"] for s in seeds) if seeds else math.nan
            row.held = {s: row.held[s] for s in seeds}
            ratio = row.ratio()
            said = "0 (chose it)" if seeds == [CHOOSE_SEED] else ",".join(map(str, seeds)) or "-"
            spread = row.spread()
            print(f"| {row.cell} | {row.family} | {row.lr:g} | {said} | {mean:.4f} | "
                  f"{'-' if spread is None else f'{spread:.4f}'} | "
                  f"{pct(row.gap('val_bpb')) if row.family != 'allreduce' else '-'} | "
                  f"{', '.join(pct(g) for g in row.seed_gaps()) if row.family != 'allreduce' else '-'} | "
                  f"{span(row.interval()) if row.family != 'allreduce' else '-'} | "
                  f"{pct(row.gap('train_loss')) if row.family != 'allreduce' else '-'} | "
                  f"{ladder.fewer(ratio) if ratio and row.family != 'allreduce' else '-'} |")
            table.append((cell, row))
    print(f"{write_csv(cells, out)} runs in {os.path.relpath(CSV)}")
    write_summary(table)
    plot(table, figure)


def publish_to(out: str, publish: bool) -> None:
    """Where --report writes workers.csv and workers.json: the committed places only with --publish; else
    beside the runs, in --out."""
    global CSV, SUMMARY
    if not publish:
        CSV, SUMMARY = os.path.join(out, "workers.csv"), os.path.join(out, "workers.json")


def write_summary(table: list[tuple[Cell, Row]]) -> None:
    """workers.json: per cell judged on held-out seeds, each saver's gaps to Allreduce (validation and last-epoch
    training loss) and its bytes ratio."""
    cells: dict[str, dict] = {}
    for cell, row in table:
        seeds = sorted(row.held)
        gap, train_gap, ratio = row.gap("val_bpb"), row.gap("train_loss"), row.ratio()
        if (row.family == "allreduce" or not judged(row) or gap is None or ratio is None
                or cell.batch != BATCH):  # a report quotes the cells of its own workload's batch
            continue
        entry = cells.setdefault(cell.name, {"size": cell.size, "params": ladder.params_of(cell.size),
                                             "workers": cell.workers, "epochs": cell.epochs, "methods": []})
        entry["methods"].append({"method": row.family, "spec": spec(row.family, cell.workers), "lr": row.lr,
                                 "gap_pct": round(gap, 2), "train_gap_pct": round(train_gap or 0.0, 2),
                                 "fewer_bytes": ladder.tenth_down(ratio),
                                 "seeds": f"held-out seeds {', '.join(map(str, seeds))}",
                                 "seed_gaps_pct": [round(g, 2) for g in row.seed_gaps()]})  # the spread a mean hides
    os.makedirs(os.path.dirname(os.path.abspath(SUMMARY)), exist_ok=True)
    with open(SUMMARY, "w") as f:
        json.dump({"commit": commit(), "workload": "GPT on the whole KJV, batch 16 windows a worker, the same samples "
                   "for every K", "cells": list(cells.values())}, f, indent=1)
        f.write("\n")
    print(f"summary for the report: {os.path.relpath(SUMMARY)}")


def points(table: list[tuple[Cell, Row]], size: str, epochs: int, family: str) -> list[tuple[int, float, list[float]]]:
    """One series of the figure: (K, the gap of the means, each held-out seed's gap) for each judged cell of
    the ladder's batch at this size and these epochs."""
    return sorted((c.workers, g, r.seed_gaps()) for c, r in table if (c.size, c.epochs, c.batch) == (size, epochs, BATCH)
                  and r.family == family and judged(r) and (g := r.gap("val_bpb")) is not None)


def plot(table: list[tuple[Cell, Row]], figure: str) -> None:
    """Gap to Allreduce (validation) against K at 4 epochs, per size; the one-epoch cells as open marks (the
    cells of the ladder's batch only: one of another batch is in the table, not the figure; a cell judged so
    far only on the choosing seed is in neither the figure nor workers.json)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"sparseloco": "tab:orange", "diloco-0.7": "tab:green", "sparseloco-256": "tab:red",
              "diloco-0.7-tau4": "tab:olive", "sparseloco-senders": "tab:purple"}
    series = {("tiny", 4): "-o", ("small", 4): "--s", ("tiny", 1): ":^", ("small", 1): ":v"}
    drawn = [(size, epochs, style, family, color, pts) for (size, epochs), style in series.items()
             for family, color in colors.items() if (pts := points(table, size, epochs, family))]
    for shift, (size, epochs, style, family, color, pts) in enumerate(drawn):  # each a little apart: bars readable
        ax.errorbar([k * 1.03 ** (shift - (len(drawn) - 1) / 2) for k, _, _ in pts], [g for _, g, _ in pts],
                    fmt=style, yerr=[[g - min(s) for _, g, s in pts], [max(s) - g for _, g, s in pts]], color=color,
                    capsize=3, mfc="none" if epochs == 1 else color,  # the bar spans the held-out seeds' own gaps
                    label=f"{family}, {size}, {epochs} epoch{'s' * (epochs > 1)}")
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks([2, 4, 8, 16])
    ax.set_xticklabels(["2", "4", "8", "16"])
    ax.set_xlabel("workers K (each a batch of 16 windows; the same samples for every K)")
    ax.set_ylabel("validation gap to Allreduce (%;\nbars: each held-out seed's)")
    ax.set_title("How far the savers end from Allreduce, by the number of workers")
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(figure)), exist_ok=True)
    fig.savefig(figure, dpi=130)
    print(f"figure: {os.path.relpath(figure)}")


def write_csv(cells: list[Cell], out: str) -> int:
    """workers.csv: every run of the new cells that ended, with its committed records."""
    fields = ["size", "params", "workers", "method", "spec", "lr", "seed", "epochs", "val_bpb", "train_loss",
              "bytes_sent_per_worker", "records", "batch"]
    found = []
    for cell in cells:
        if (cell.workers, cell.epochs) == (4, 4):
            continue
        for job in cell_jobs(cell, out):
            recs = ladder.read_records(job.kept)
            if not recs and not failed(job):
                continue
            last = recs[-1] if recs else {}
            ok = bool(recs) and last["epoch"] >= cell.epochs
            found.append({"size": cell.size, "params": ladder.params_of(cell.size), "workers": cell.workers,
                          "method": job.family, "spec": job.spec, "lr": f"{job.lr:g}", "seed": job.seed,
                          "epochs": last.get("epoch", 0), "val_bpb": f"{last['val_bpb']:.6f}" if ok else "failed",
                          "train_loss": f"{last['train_loss']:.6f}" if ok else "",
                          "bytes_sent_per_worker": f"{last.get('bytes_sent_per_worker', 0):.0f}",
                          "records": os.path.relpath(job.kept, os.path.dirname(HERE)), "batch": cell.batch})
    os.makedirs(os.path.dirname(os.path.abspath(CSV)), exist_ok=True)
    with open(CSV, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(found)
    return len(found)


def plan(cells: list[Cell], out: str) -> None:
    """The runs known to be still to run, in order, and how long the cells' runs should take here: at least
    3 rates on seed 0 and the 3 held-out seeds for each family, at each cell's median wall time of its
    finished runs (their last record's `time.elapsed_s`; runs from before eval_ranks=1 took longer)."""
    total, untimed = 0.0, 0
    for cell in cells:
        jobs = cell_jobs(cell, out)
        for job in (j for j in jobs if not done(j, out)):
            print(f"{cell.name:15} {job.family:14} lr={job.lr:g} seed {job.seed}")
        took = [t for j in jobs if (r := final(j, out)) and (t := r.get("time", {}).get("elapsed_s"))]
        finished = sum(done(j, out) for j in jobs)
        left = sum(max(3, len(tried(cell, f, out))) + len(HELD_OUT) for f in cell.families) - finished
        each = statistics.median(took) if took else None
        if left > 0:
            print(f"{cell.name:15} at least {left} run(s) left" + (f", about {left * each / 3600:.1f} h (median "
                  f"{each / 60:.1f} min a run of {len(took)} here)" if each else ", none finished here to time them"))
        total, untimed = total + max(left, 0) * (each or 0), untimed + (0 if each else max(left, 0))
    print(f"at least {total / 3600:.1f} h" + (f", and {untimed} run(s) not timed" if untimed else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="run the next jobs until none is left (or SIGTERM)")
    p.add_argument("--plan", action="store_true", help="print the jobs known to be still to run, in order")
    p.add_argument("--report", action="store_true", help="print the table, write workers.csv and the figure")
    names = [c.name for c in CELLS]
    p.add_argument("--cells", default=",".join(names), help=f"comma-separated cells, of {', '.join(names)}")
    p.add_argument("--families", default="", help="--run and --plan take only these families' runs (comma-separated, "
                   f"of {', '.join(FAMILIES)}; default: every family of each cell)")
    p.add_argument("--out", default="runs/workers", help="parent of the run directories (default runs/workers)")
    p.add_argument("--figure", default="", help="the figure's PNG (default: workers.png in --out; with --publish "
                   "benchmarks/figures/workers.png)")
    p.add_argument("--publish", action="store_true", help="--report writes the committed workers.csv and "
                   "workers.json (every report quotes it) and figure; without it they go to --out")
    args = p.parse_args()
    if not (args.run or args.plan or args.report):
        p.error("nothing to do: give --run, --plan or --report")
    want = [c.strip() for c in args.cells.split(",") if c.strip()]
    bad = [c for c in want if c not in names]
    if bad or not want:
        p.error(f"--cells {args.cells!r}: {', '.join(bad) or 'no cell'} is not one of {', '.join(names)}")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
    from lowband.errors import UsageError
    from lowband.paths import can_make_dir, writable_file

    if args.publish and not args.report:
        p.error("--publish goes with --report")
    args.figure = args.figure or (os.path.join(HERE, "figures", "workers.png") if args.publish
                                  else os.path.join(args.out, "workers.png"))
    try:
        can_make_dir(args.out, "--out")
        writable_file(args.figure, "--figure")
    except UsageError as e:
        p.error(str(e))
    only = [f.strip() for f in args.families.split(",") if f.strip()]
    if set(only) - set(FAMILIES):
        p.error(f"--families {args.families!r}: {', '.join(sorted(set(only) - set(FAMILIES)))} is not one of "
                f"{', '.join(FAMILIES)}")
    cells = [c for c in CELLS if c.name in want]
    queue = [replace(c, families=tuple(f for f in c.families if f in only)) for c in cells] if only else cells
    signal.signal(signal.SIGTERM, stop)
    try:
        if args.plan:
            plan(queue, args.out)
        while args.run and not STOPPING and (job := next_job(queue, args.out)) is not None:
            train(job, args.out)
        if args.report:
            publish_to(args.out, args.publish)
            report([Cell("tiny", 4, 4), Cell("small", 4, 4, ("allreduce", "sparseloco", "diloco-0.7")), *cells],
                   args.out, args.figure)
    except KeyboardInterrupt:
        stop(signal.SIGINT, None)
        print("interrupted: the run training resumes from its last checkpoint next time", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
