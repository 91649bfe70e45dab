"""How close low-communication methods come to Allreduce's loss on the whole KJV text, and at what bytes.

The lm suite's workload (byte-level GPT "tiny", 220,544 parameters, context 64, batch 16, 4 workers,
AdamW with warm-up and cosine decay, rate not scaled with the workers) on the WHOLE KJV text (4.3 MB,
`data.max_bytes=0`: 80% train, 10% validation, 10% test), 4 epochs: 3,360 inner steps a worker, so
tau = 8..64 gives 420..52 outer steps. Two phases, each run once and kept (the script resumes):

  tune   seed 0: Allreduce at inner rates 0.004 and 0.008 (its best was the old grid's top), and
         DiLoCo, SparseLoCo and local SGD over inner rate x outer rate x tau (a hand-picked sweep
         of the settings the papers recommend: outer lr up to 1.0, SparseLoCo at 1/64 density with
         2-bit values, with and without outer momentum), the most telling first
  seeds  the best setting of each family on validation loss, on seeds 1 and 2 as well
  trend  Allreduce, SparseLoCo and DiLoCo at 1/4 and 1/2 of the steps: is the gap closing with length?
  lookahead  one worker, one epoch: `single` against DiLoCo with --workers 1 (M = 1), whose outer
         step is a lookahead on one trajectory: the gain that is not parallelism
  long   Allreduce's and DiLoCo's best at twice the steps (8 epochs, seed 0): does the gap reach 1%?
  ending SparseLoCo's end of run (issue 40): its best setting with the error buffer's decay moved to 1
         as the run ends, a dense flush of the buffers at the end, both, and no decay at all, on seed 0;
         the best of them on seeds 1 and 2, and at 8 epochs. Prints per epoch the gap to Allreduce and
         where the buffers' mass went (sent, decayed, kept, against the pseudo-gradient).
`--phase all` runs the first CORE settings, the trend, the lookahead runs, the inner rates, Allreduce's,
DiLoCo's and SparseLoCo's best on seeds 1 and 2, the long runs, the rest of the sweep, then any family whose best
moved (or local SGD's) on seeds 1 and 2.

Prints per setting: mean ± sd of the final validation bits per byte, the gap to Allreduce's mean,
bytes sent per worker, Allreduce's bytes over the setting's ("ratio"), outer steps, whether the mean
is within 1% of Allreduce's, the ratio at equal loss (Allreduce's bytes over the setting's bytes when
its mean curve first came within 1%; "-" if never), and per-epoch curves that say why a setting fell
short. Writes the frontier (validation bits per byte against bytes per worker, every setting) to
`--figure`.

Run: python benchmarks/lm_study.py [--phase tune|seeds|lookahead|ending|all] [--out runs/lm_study] [--report|--collect]
On a GPU machine: --device cuda --parallel 4 --results benchmarks/results/lm_study_gpu (4 runs at once, each
4 workers sharing the GPU through gloo; its records kept apart from the CPU's).
About 4 minutes a run alone on 2 cores (15 while other jobs share them); `--phase all` is about 20
runs. Safe to stop and start again: an unfinished run resumes from its checkpoint, and each finished
run's records are copied to benchmarks/results/lm_study/ (committed), so a later session, or anyone,
reports the study and continues it without the run directories.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from common import commit, mean_sd, method_flags

BASE = ["--dataset", "text", "--model", "gpt", "--set", "model.size='tiny'", "--set", "data.max_bytes=0",
        "--set", "data.context=64", "--batch-size", "16",
        "--set", "optim.name='adamw'", "--set", "optim.weight_decay=0.1", "--set", "optim.warmup_epochs=0.25",
        "--set", "optim.lr_scaling='none'"]
SPARSE = "sparseloco:density=0.015625:codec=lut2"
TUNE = [  # (family, method spec, inner lr), in the order they run: the most telling first
    ("allreduce", "allreduce", 0.004),
    ("sparseloco", f"{SPARSE}:tau=16", 0.004),
    ("allreduce", "allreduce", 0.008),
    ("sparseloco", f"{SPARSE}:tau=8", 0.004),
    ("diloco", "diloco:tau=16:outer_lr=1.0", 0.004),
    # then the trend over run length and the one-worker lookahead runs, then these (the most telling
    # first: the rate, SparseLoCo's density and momentum, then DiLoCo's outer steps), then the seeds
    ("sparseloco", f"{SPARSE}:tau=8", 0.008),  # 0.008 beat 0.004 for Allreduce: and for SparseLoCo?
    ("allreduce", "allreduce", 0.016),  # is 0.008 the top of Allreduce's range?
    ("diloco", "diloco:tau=16:outer_lr=1.0", 0.008),
    ("allreduce", "allreduce", 0.032),  # 0.016 beat 0.008: bracket Allreduce's best rate
    ("sparseloco", "sparseloco:density=0.0625:codec=lut2:tau=8", 0.004),  # 4x the density: is top-k the loss?
    ("sparseloco", f"{SPARSE}:tau=8:outer_momentum=0.9", 0.004),  # the paper's EF-instead-of-momentum, measured
    ("diloco", "diloco:tau=32:outer_lr=1.0", 0.004),
    ("diloco", "diloco:tau=16:outer_lr=0.7", 0.004),
    ("local_sgd", "local_sgd:tau=16", 0.004),
    ("sparseloco", f"{SPARSE}:tau=8", 0.016),  # SparseLoCo gained most from 0.004 -> 0.008
]
CORE = 5  # TUNE[:CORE] run before the trend and the seeds
TREND = [("allreduce", 0.004), (f"{SPARSE}:tau=16", 0.004), ("diloco:tau=16:outer_lr=1.0", 0.004)]
TREND_EPOCHS = (1, 2)  # the same settings at 1/4 and 1/2 of the steps (each its own cosine schedule)
LONG = [("allreduce", 0.016), ("diloco:tau=16:outer_lr=1.0", 0.004)]  # each family's best at seed 0, at
LONG_EPOCHS = 8  # twice the steps (6,720 a worker, 420 DiLoCo outer steps): does the gap reach 1%?
LOOKAHEAD = [("single", "single", 0.004), ("diloco M=1", "diloco:tau=16:outer_lr=0.7", 0.004),
             ("diloco M=1", "diloco:tau=16:outer_lr=1.0", 0.004)]  # one worker, one epoch (3,363 steps)
SEEDS = (1, 2)
MARGIN = 0.01
REFERENCE = ("allreduce", 0.016)  # Allreduce at its best rate (bracketed on seed 0, 3 seeds)
ENDING_LR = 0.008  # SparseLoCo's best inner rate (tau 8, 1/64, lut2; 3 seeds)
ENDING = [  # issue 40: what SparseLoCo loses at the end of the run, one change at a time, then together
    f"{SPARSE}:tau=8",  # today's best
    f"{SPARSE}:tau=8:ef_decay_end=1.0",  # the buffer stops forgetting as the inner rate falls
    f"{SPARSE}:tau=8:flush=int8",  # what the buffers hold at the end, sent once, dense
    f"{SPARSE}:tau=8:ef_decay_end=1.0:flush=int8",
    f"{SPARSE}:tau=8:ef_decay=1.0",  # never forget (plain error feedback)
    f"{SPARSE}:tau=8:ef_decay=1.0:flush=int8",
    # forgetting faster as the run ends (the other direction: is stale mass in the buffer the harm?)
    f"{SPARSE}:tau=8:ef_decay_end=0.5",
    f"{SPARSE}:tau=8:ef_decay_end=0.0",
    f"{SPARSE}:tau=8:ef_decay=0.8",
    # a wider channel late (stop 46): at β 1 the 1/64 channel was the limit; 1/64 -> 1/16 over the last
    # quarter (or half) of the run: 1.375x (1.75x) the bytes of 1/64 throughout, by the codec's payload count
    f"{SPARSE}:tau=8:ef_decay=1.0:flush=int8:density_end=0.0625:density_from=0.75",
    f"{SPARSE}:tau=8:ef_decay=1.0:flush=int8:density_end=0.0625:density_from=0.5",
    # stop 47: a larger outer step, for the mass the channel delays and the decay drops (the same rounds
    # sent densely below lose less; Allreduce at a lower rate shows the same late loss as SparseLoCo)
    f"{SPARSE}:tau=8:outer_lr=1.5",
    f"{SPARSE}:tau=8:outer_lr=2.0",
    f"{SPARSE}:tau=8:outer_lr=3.0",
    f"{SPARSE}:tau=8:outer_lr=4.0",
    f"{SPARSE}:tau=8:outer_lr=3.0:ef_decay=1.0:flush=int8",  # the larger step with the buffer that forgets nothing
    # stop 48: the workers' top-k overlap little (about 1.3 messages per coordinate sent of 4), so the mean
    # over workers divides most coordinates by 4; the mean over each coordinate's senders does not
    f"{SPARSE}:tau=8:mean=senders",
    # the larger the outer step, the less of the lead is lost in the last epoch (outer lr 1.5 / 2 / 3 / 4:
    # 2.6 / 2.1 / 0.9 / 0.2 points from epoch 3 to 4): outer lr 3, rising in the second half of the run
    f"{SPARSE}:tau=8:outer_lr=3.0:outer_lr_end=6.0:outer_lr_from=0.5",
]
# the same rounds with nothing left out: every coordinate averaged in fp32 (periodic averaging, outer lr 1,
# no momentum). Not a candidate (32x SparseLoCo's bytes per sync), a bound: how much of SparseLoCo's gap
# is its channel's, and how much the local steps' own.
ENDING_BOUNDS = ["local_sgd:tau=8"]
# stop 49, the best setting (outer lr 3) at another inner rate or sync shape (their own lr beside the spec):
# with ~1 sender per coordinate of 4, outer lr 3 steps at about 3/4 of the inner rate, and Allreduce below
# its best rate ends behind the same way, so a higher inner rate (0.016, then 0.012 between); and twice
# the syncs at half the density (the same bytes)
ENDING_OTHER = [(f"{SPARSE}:tau=8:outer_lr=3.0", 0.016), (f"{SPARSE}:tau=8:outer_lr=3.0", 0.012),
                ("sparseloco:density=0.0078125:codec=lut2:tau=4:outer_lr=3.0", ENDING_LR),
                # stop 50: 0.008 led early and lost late, 0.016 the other way round: the inner rate's factor
                # rises over the run from half (0.008 at the peak) to whole (0.016's cosine at the end)
                (f"{SPARSE}:tau=8:outer_lr=3.0:inner_lr_factor=0.5:inner_lr_factor_end=1.0", 0.016),
                # and the other way: 0.016 closes its gap late, so the factor rises from 1 to 2 (a flatter end)
                (f"{SPARSE}:tau=8:outer_lr=3.0:inner_lr_factor_end=2.0", 0.016),
                # 4-bit values (16 levels per 1,024) instead of 2-bit, at 63 of each 4,096 instead of 64 so that
                # the bytes stay within 500x of Allreduce's
                ("sparseloco:density=0.015380859375:codec=lut4:tau=8:outer_lr=3.0", 0.016),
                # half the syncs at twice the density: the same bytes (tau 4 at 1/128 lost to tau 8 at 1/64)
                ("sparseloco:density=0.03125:codec=lut2:tau=16:outer_lr=3.0", 0.016)]
BEST = (f"{SPARSE}:tau=8:outer_lr=3.0", 0.016)  # SparseLoCo's best ending (stop 49), on five seeds (stop 51)
MORE_SEEDS = (3, 4)  # the best and the reference beyond seeds 0-2: is the gap more than the seeds' spread?
ENDING_LONG = 8  # the best ending at twice the steps, against Allreduce's at that length
DEVICE: list[str] = []  # --set options that put the runs on a device (main's --device)


def label(spec: str, lr: float) -> str:
    return f"{spec} lr={lr:g}"


def run_dir(out: str, spec: str, lr: float, seed: int, workers: int = 4, epochs: int = 4) -> str:
    name = label(spec, lr).replace(":", "_").replace("=", "-").replace(" ", "_") + f"_seed-{seed}"
    return os.path.join(out, name + ("" if workers == 4 else f"_workers-{workers}") + ("" if epochs == 4 else
                                                                                      f"_epochs-{epochs}"))


RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "lm_study")


def records(path: str) -> list[dict]:
    """A run's per-epoch records: from its run directory, else from the copy kept in RESULTS (the
    study's figures are committed there, so a later session reports and resumes without the runs)."""
    for source in (os.path.join(path, "metrics.jsonl"), os.path.join(RESULTS, os.path.basename(path) + ".jsonl")):
        try:
            with open(source) as f:
                recs = [json.loads(line) for line in f if line.strip()]
        except (OSError, json.JSONDecodeError):
            continue
        if recs:
            return recs
    return []


def keep(path: str) -> None:
    """Copy a finished run's records into RESULTS (the per-tag byte tables left out: totals stay)."""
    recs = records(path)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, os.path.basename(path) + ".jsonl"), "w") as f:
        for r in recs:
            f.write(json.dumps({k: v for k, v in r.items() if k != "bytes"}) + "\n")


def finished(path: str, epochs: int = 4) -> bool:
    recs = records(path)
    return bool(recs) and recs[-1]["epoch"] >= epochs


def train(out: str, spec: str, lr: float, seed: int, workers: int = 4, epochs: int = 4) -> None:
    """One run of the setting, resumed if an earlier call was stopped; skipped when it finished."""
    path = run_dir(out, spec, lr, seed, workers, epochs)
    if finished(path, epochs):
        return
    if os.path.isdir(path) and not records(path):  # stopped before its first epoch's checkpoint: start again
        shutil.rmtree(path)
    args = ["--resume", path] if os.path.exists(os.path.join(path, "config.toml")) else [
        *method_flags(spec, round_evals=False), *BASE, "--workers", str(workers), "--epochs", str(epochs),
        "--set", f"optim.lr={lr}", "--seed", str(seed), "--run-dir", path, *DEVICE]
    t0 = time.time()
    print(f"$ lowband train {' '.join(args)}", flush=True)
    code = subprocess.run([sys.executable, "-m", "lowband", "train", "-q", *args], check=False).returncode
    print(f"  exit {code} after {time.time() - t0:.0f} s", flush=True)
    if finished(path, epochs):
        keep(path)


def train_all(jobs: list[tuple], parallel: int) -> None:
    """train(*job) for every job, `parallel` at a time (each is its own group of worker processes)."""
    if parallel <= 1:
        for job in jobs:
            train(*job)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda job: train(*job), jobs))


def best_ending(out: str) -> tuple[str, float] | None:
    """The ending row (spec, inner lr) with the lowest final validation bits per byte on seed 0 (None: none
    finished); the dense bound is not a candidate."""
    rows = [(spec, lr) for spec, lr in ending_rows() if spec not in ENDING_BOUNDS]
    done = [(records(run_dir(out, spec, lr, 0)), (spec, lr)) for spec, lr in rows]
    done = [(r[-1]["val_bpb"], row) for r, row in done if r and r[-1]["epoch"] >= 4]
    return min(done)[1] if done else None


def ending(out: str, parallel: int) -> None:
    """Issue 40's ablation on seed 0 beside Allreduce's reference, then the best on seeds 1, 2 and at 8 epochs."""
    out_ref = [(out, REFERENCE[0], REFERENCE[1], seed) for seed in (0, *SEEDS)]
    train_all([out_ref[0]] + [(out, spec, lr, 0) for spec, lr in ending_rows()], parallel)
    best = best_ending(out)
    assert best is not None, "no ending setting finished"
    later = out_ref[1:] + [(out, *best, seed) for seed in SEEDS]
    train_all(later, parallel)
    train_all([(out, *REFERENCE, 0, 4, ENDING_LONG), (out, *best, 0, 4, ENDING_LONG)], parallel)


def ending_report(out: str) -> None:
    """Per ENDING setting: the final gap to Allreduce (mean over finished seeds), bytes, and per epoch the
    gap and the error buffers' flows (mean per sync, rank 0: sent, decayed and kept over ‖Δ‖)."""
    ref = [records(run_dir(out, *REFERENCE, s)) for s in (0, *SEEDS)]
    ref = [r for r in ref if r and r[-1]["epoch"] >= 4]
    if not ref:
        return
    ref_bpb = statistics.mean(r[-1]["val_bpb"] for r in ref)
    ref_bytes = statistics.mean(r[-1]["bytes_sent_per_worker"] for r in ref)
    print(f"\nSparseLoCo's end of run (issue 40), lr {ENDING_LR:g}, against {label(*REFERENCE)} "
          f"({len(ref)} seeds, {ref_bpb:.4f}):\n")
    print("| setting | seeds | val bpb (mean ± sd) | vs allreduce | MB sent/worker | ratio | within 1% |")
    print("|---|---|---|---|---|---|---|")
    for spec, lr in ending_rows():
        curves = [records(run_dir(out, spec, lr, s)) for s in (0, *SEEDS)]
        curves = [c for c in curves if c and c[-1]["epoch"] >= 4]
        if not curves:
            continue
        bpb = [c[-1]["val_bpb"] for c in curves]
        sent = statistics.mean(c[-1]["bytes_sent_per_worker"] for c in curves)
        gap = 100 * (statistics.mean(bpb) / ref_bpb - 1)
        print(f"| {row_label(spec, lr)} | {len(curves)} | {mean_sd(bpb)} | {gap:+.2f}% | {sent / 1e6:.3f} | "
              f"{fewer(ref_bytes / sent)} | {'yes' if gap <= 100 * MARGIN else 'no'} |")
    ref0 = ref[0]
    print("\nSeed 0 per epoch: gap to Allreduce (same epoch, same seed); the buffers' flows per sync "
          "as shares of ‖Δ‖ (sent / decayed / kept), then xN: the workers' messages per coordinate sent\n")
    for spec, lr in ending_rows():
        recs = records(run_dir(out, spec, lr, 0))
        if not recs:
            continue
        gaps = " ".join(f"{100 * (r['val_bpb'] / q['val_bpb'] - 1):+.1f}%" for r, q in zip(recs, ref0, strict=False))
        flows = " ".join(_flow(r) for r in recs)
        print(f"{row_label(spec, lr)}: {gaps}; flows {flows}")
    ending_long(out)
    best_seeds_report(out)
    to_target_report(out)


def best_seeds_report(out: str) -> None:
    """BEST against Allreduce paired by seed, over every seed both finished (0-2, then MORE_SEEDS): the gap per
    seed, its mean with the standard error, and the gap of the means."""
    pairs, curves = [], []
    for seed in (0, *SEEDS, *MORE_SEEDS):
        run, ref = records(run_dir(out, *BEST, seed)), records(run_dir(out, *REFERENCE, seed))
        if run and ref and run[-1]["epoch"] >= 4 and ref[-1]["epoch"] >= 4:
            pairs.append((seed, run[-1]["val_bpb"], ref[-1]["val_bpb"]))
            curves.append((seed, run, ref))
    if len(pairs) < 2:
        return
    print(f"\n{row_label(*BEST)} against {label(*REFERENCE)} per epoch, by seed: the gap in validation bits per "
          "byte; the gap in training loss\n")
    for seed, run, ref in curves:
        val = " ".join(f"{100 * (r['val_bpb'] / q['val_bpb'] - 1):+.2f}%" for r, q in zip(run, ref, strict=False))
        fit = " ".join(f"{100 * (r['train_loss'] / q['train_loss'] - 1):+.1f}%" for r, q in zip(run, ref, strict=False))
        print(f"seed {seed}: val {val}; train loss {fit}")
    gaps = [100 * (bpb / ref - 1) for _, bpb, ref in pairs]
    se = statistics.stdev(gaps) / math.sqrt(len(gaps))
    means = 100 * (statistics.mean(b for _, b, _ in pairs) / statistics.mean(r for _, _, r in pairs) - 1)
    each = ", ".join(f"seed {seed} {g:+.2f}%" for (seed, _, _), g in zip(pairs, gaps, strict=True))
    print(f"\n{row_label(*BEST)} against {label(*REFERENCE)}, paired by seed at 4 epochs: {each}; within 1% on "
          f"{sum(g <= 100 * MARGIN for g in gaps)} of {len(gaps)}; mean gap {statistics.mean(gaps):+.2f}% "
          f"(standard error {se:.2f}); gap of the means {means:+.2f}%")


def to_target_report(out: str) -> None:
    """Issue 40's item 4 on the whole text, from BEST's ENDING_LONG-epoch runs: a `--budget target:2` run is
    that run (its cosine planned over the cap, twice Allreduce's 4 epochs) stopped at the first epoch whose
    validation bits per byte reach Allreduce's 4-epoch figure of the same seed, within the metric's 1%
    (lowband.data.metric: BITS_PER_BYTE.reaches). Per seed: that epoch, its samples and its bytes."""
    from lowband.data.metric import BITS_PER_BYTE

    lines = []
    for seed in (0, *SEEDS, *MORE_SEEDS):
        run, ref = records(run_dir(out, *BEST, seed, epochs=ENDING_LONG)), records(run_dir(out, *REFERENCE, seed))
        if not (run and ref and run[-1]["epoch"] >= ENDING_LONG and ref[-1]["epoch"] >= 4):
            continue
        target, ref_bytes = ref[-1]["val_bpb"], ref[-1]["bytes_sent_per_worker"]
        hit = next((r for r in run if BITS_PER_BYTE.reaches(r["val_bpb"], target)), None)
        exact = next((r for r in run if r["val_bpb"] <= target), None)
        if hit is None:
            lines.append(f"seed {seed}: target {target:.4f}; not reached in {ENDING_LONG} epochs")
            continue
        lines.append(f"seed {seed}: target {target:.4f} (Allreduce, 4 epochs, {ref_bytes / 1e6:,.0f} MB); reached "
                     f"within 1% at epoch {hit['epoch']} ({hit['val_bpb']:.4f}; {hit['epoch'] / 4:g}x the samples, "
                     f"{hit['bytes_sent_per_worker'] / 1e6:.2f} MB, {fewer(ref_bytes / hit['bytes_sent_per_worker'])}x "
                     f"fewer bytes); at or below it at epoch "
                     + (f"{exact['epoch']} ({exact['val_bpb']:.4f}, {exact['bytes_sent_per_worker'] / 1e6:.2f} MB, "
                        f"{fewer(ref_bytes / exact['bytes_sent_per_worker'])}x)" if exact else "none"))
    if lines:
        print(f"\n{row_label(*BEST)} under --budget target:2 on the whole text (its {ENDING_LONG}-epoch runs, "
              "stopped where they reach the target):\n")
        print("\n".join(lines))


def fewer(ratio: float) -> str:
    """A byte ratio rounded down, so that a saving is never overstated against a goal (499.8x prints 499)."""
    return f"{math.floor(ratio):,}"


def ending_rows() -> list[tuple[str, float]]:
    """(spec, inner lr) of every ending row: the ablation, the other rates and shapes, the dense bound."""
    return [(spec, ENDING_LR) for spec in ENDING] + ENDING_OTHER + [(spec, ENDING_LR) for spec in ENDING_BOUNDS]


def row_label(spec: str, lr: float) -> str:
    """The report's name of a row: its setting, and its inner rate where that is not ENDING_LR."""
    return short(spec) + ("" if lr == ENDING_LR else f" lr={lr:g}")


def ending_long(out: str) -> None:
    """Every ending row run at ENDING_LONG epochs against Allreduce's at that length, per seed with both runs
    (a seed with only the ending's run prints its final figure alone)."""
    for row in ending_rows():
        for seed in (0, *SEEDS):
            ref, run = (records(run_dir(out, spec, lr, seed, epochs=ENDING_LONG)) for spec, lr in (REFERENCE, row))
            if run and run[-1]["epoch"] >= ENDING_LONG:
                print("\n" + long_line(row, seed, run, ref))


def long_line(row: tuple[str, float], seed: int, run: list[dict], ref: list[dict]) -> str:
    """One ending row's run at ENDING_LONG epochs: its final figure, and against Allreduce's run per epoch."""
    head = f"{row_label(*row)} at {ENDING_LONG} epochs (seed {seed}): {run[-1]['val_bpb']:.4f}"
    if not ref:
        return head + "; no Allreduce run of this seed and length"
    gaps = " ".join(f"{100 * (r['val_bpb'] / q['val_bpb'] - 1):+.1f}%" for r, q in zip(run, ref, strict=False))
    ratio = ref[-1]["bytes_sent_per_worker"] / run[-1]["bytes_sent_per_worker"]
    return f"{head} against {ref[-1]['val_bpb']:.4f}; per epoch {gaps}; {fewer(ratio)}x fewer bytes"


def _flow(record: dict) -> str:
    ef = record.get("extra", {}).get("ef") or record.get("ef")
    if not ef or not ef.get("delta"):
        return "-"
    d = ef["delta"]
    overlap = f" x{ef['senders']:.2f}" if ef.get("senders") else ""  # messages per coordinate sent (stop 48 on)
    return f"{ef['sent'] / d:.2f}/{ef['decayed'] / d:.2f}/{ef['kept'] / d:.1f}{overlap}"


def short(spec: str) -> str:
    return spec.replace(f"{SPARSE}:", "sparseloco:") + (" (dense bound)" if spec in ENDING_BOUNDS else "")


def seeds(out: str, families: tuple[str, ...] | None = None) -> None:
    """The best setting of each family (of `families`, or all) on seeds 1 and 2 too."""
    for family, (spec, lr) in tuned_best(out).items():
        if families is None or family in families:
            for seed in SEEDS:
                train(out, spec, lr, seed)


def tuned_best(out: str) -> dict[str, tuple[str, float]]:
    """Per family, the seed-0 setting with the lowest final validation bits per byte."""
    best: dict[str, tuple[float, str, float]] = {}
    for family, spec, lr in TUNE:
        recs = records(run_dir(out, spec, lr, 0))
        if recs and recs[-1]["epoch"] >= 4 and recs[-1].get("val_bpb") is not None:
            v = recs[-1]["val_bpb"]
            if family not in best or v < best[family][0]:
                best[family] = (v, spec, lr)
    return {f: (s, lr) for f, (_, s, lr) in best.items()}


def settings_run(out: str) -> list[tuple[str, str, float, list[list[dict]]]]:
    """(family, spec, lr, every finished seed's records) for each setting with a finished run."""
    rows = []
    for family, spec, lr in TUNE:
        seeds = [records(run_dir(out, spec, lr, s)) for s in (0, *SEEDS)]
        done = [r for r in seeds if r and r[-1]["epoch"] >= 4]
        if done:
            rows.append((family, spec, lr, done))
    return rows


def within_bytes(curves: list[list[dict]], target: float) -> float | None:
    """Mean bytes per worker at the first epoch whose mean val_bpb is within MARGIN of `target`."""
    for e in range(min(len(c) for c in curves)):
        if statistics.mean(c[e]["val_bpb"] for c in curves) <= target * (1 + MARGIN):
            return statistics.mean(c[e]["bytes_sent_per_worker"] for c in curves)
    return None


def report(out: str, figure: str) -> None:
    rows = settings_run(out)
    ref = min((r for r in rows if r[0] == "allreduce"), key=lambda r: statistics.mean(c[-1]["val_bpb"] for c in r[3]),
              default=None)
    if ref is None:
        print("no finished Allreduce run yet")
        return
    ref_bpb = statistics.mean(c[-1]["val_bpb"] for c in ref[3])
    ref_bytes = statistics.mean(c[-1]["bytes_sent_per_worker"] for c in ref[3])
    print(f"\nGPT tiny, whole KJV (4.3 MB), context 64, batch 16, 4 workers, 4 epochs (3,360 steps a worker); "
          f"commit {commit()}; reference: {label(ref[1], ref[2])} ({len(ref[3])} seeds)\n")
    print("| setting | seeds | val bpb (mean ± sd) | vs allreduce | MB sent/worker | ratio | outer steps | within 1% "
          "| ratio at equal loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _family, spec, lr, curves in rows:
        bpb = [c[-1]["val_bpb"] for c in curves]
        sent = statistics.mean(c[-1]["bytes_sent_per_worker"] for c in curves)
        gap = 100 * (statistics.mean(bpb) / ref_bpb - 1)
        at = within_bytes(curves, ref_bpb)
        outer = curves[0][-1].get("outer_steps", "-")
        print(f"| {label(spec, lr)} | {len(curves)} | {mean_sd(bpb)} | {gap:+.2f}% | {sent / 1e6:.3f} | "
              f"{fewer(ref_bytes / sent)} | {outer} | {'yes' if statistics.mean(bpb) <= ref_bpb * (1 + MARGIN) else 'no'} | "
              f"{'-' if not at else fewer(ref_bytes / at)} |")
    print("\nMean over seeds after each epoch: validation bits per byte; training loss (nats)\n")
    for _family, spec, lr, curves in rows:
        epochs = min(len(c) for c in curves)
        val = [statistics.mean(c[e]["val_bpb"] for c in curves) for e in range(epochs)]
        tr = [statistics.mean(c[e]["train_loss"] for c in curves) for e in range(epochs)]
        secs = statistics.mean(c[-1]["time"]["train_s"] for c in curves)
        print(f"{label(spec, lr)}: val bpb {' '.join(f'{v:.3f}' for v in val)}; train loss "
              f"{' '.join(f'{v:.3f}' for v in tr)}; {secs:.0f} s training (4 workers sharing 2 cores with other jobs)")
    plot(rows, ref_bpb, figure)
    trend(out)
    longer(out)
    lookahead(out)


def trend(out: str) -> None:
    """The gap to Allreduce at 1/4, 1/2 and all of the steps (each run its own cosine schedule)."""
    ref = {e: records(run_dir(out, TREND[0][0], TREND[0][1], 0, epochs=e)) for e in (*TREND_EPOCHS, 4)}
    if not all(ref.values()):
        return
    print("\nThe gap to Allreduce (same length, seed 0) against the run's length:\n")
    print("| setting | " + " | ".join(f"{840 * e:,} steps" for e in (*TREND_EPOCHS, 4)) + " |")
    print("|---|" + "---|" * (len(TREND_EPOCHS) + 1))
    for spec, lr in TREND:
        cells = []
        for e in (*TREND_EPOCHS, 4):
            recs = records(run_dir(out, spec, lr, 0, epochs=e))
            cells.append(f"{recs[-1]['val_bpb']:.4f} ({100 * (recs[-1]['val_bpb'] / ref[e][-1]['val_bpb'] - 1):+.1f}%)"
                         if recs and recs[-1]["epoch"] >= e else "-")
        print(f"| {label(spec, lr)} | " + " | ".join(cells) + " |")


def longer(out: str) -> None:
    """Each family's best at twice the steps, against Allreduce's at the same length (seed 0)."""
    runs = [(spec, lr, records(run_dir(out, spec, lr, 0, epochs=LONG_EPOCHS))) for spec, lr in LONG]
    runs = [(spec, lr, recs) for spec, lr, recs in runs if recs and recs[-1]["epoch"] >= LONG_EPOCHS]
    if not runs or runs[0][0] != "allreduce":
        return
    ref = runs[0][2][-1]
    steps = 840 * LONG_EPOCHS
    print(f"\n{LONG_EPOCHS} epochs ({steps:,} steps a worker), seed 0, against {label(*LONG[0])} at that length:\n")
    for spec, lr, recs in runs:
        last, four = recs[-1], recs[3]
        sent = last["bytes_sent_per_worker"]
        curve = " ".join(f"{r['val_bpb']:.3f}" for r in recs)
        print(f"{label(spec, lr)}: val bpb {last['val_bpb']:.4f} ({100 * (last['val_bpb'] / ref['val_bpb'] - 1):+.2f}%), "
              f"{sent / 1e6:.3f} MB sent/worker ({fewer(ref['bytes_sent_per_worker'] / sent)}x fewer), "
              f"{last.get('outer_steps', '-')} outer steps; per epoch "
              f"{curve} (at epoch 4 of this schedule: {four['val_bpb']:.4f})")


def lookahead(out: str) -> None:
    """One worker, one epoch: plain training against DiLoCo's outer step on one trajectory."""
    done = [(name, spec, lr, records(run_dir(out, spec, lr, 0, workers=1, epochs=1))) for name, spec, lr in LOOKAHEAD]
    done = [d for d in done if d[3]]
    if done:
        print("\nOne worker, one epoch of the whole text (3,363 steps): the outer step's lookahead alone\n")
        for name, spec, lr, recs in done:
            print(f"{name} ({label(spec, lr)}): val bpb {recs[-1]['val_bpb']:.4f}")


def plot(rows, ref_bpb: float, figure: str) -> None:
    """Validation bits per byte against bytes sent per worker (log), one point per setting, error bars
    over seeds; the band is Allreduce's loss + 1%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colours = {"allreduce": "black", "diloco": "tab:blue", "sparseloco": "tab:red", "local_sgd": "tab:green"}
    placed: list[tuple[float, float]] = []  # labels already drawn: a label near one goes to the other side
    span = max(c[-1]["val_bpb"] for *_, cs in rows for c in cs) - min(c[-1]["val_bpb"] for *_, cs in rows for c in cs)
    for family, spec, lr, curves in rows:
        bpb = [c[-1]["val_bpb"] for c in curves]
        sent = statistics.mean(c[-1]["bytes_sent_per_worker"] for c in curves)
        sd = statistics.stdev(bpb) if len(bpb) > 1 else 0.0
        y = statistics.mean(bpb)
        ax.errorbar(sent, y, yerr=sd, fmt="o", color=colours.get(family, "grey"), capsize=3)
        near = sum(1 for px, py in placed if abs(px - sent) < 0.2 * sent and abs(py - y) < 0.03 * max(span, 1e-9))
        placed.append((sent, y))
        ax.annotate(label(spec, lr).replace("sparseloco:density=0.015625:codec=lut2", "sparseloco"), (sent, y),
                    fontsize=7, textcoords="offset points", va="center", xytext=(-6, -9 * (near // 2)) if near % 2
                    else (6, -9 * (near // 2)), ha="right" if near % 2 else "left")
    ax.axhspan(ref_bpb, ref_bpb * (1 + MARGIN), color="grey", alpha=0.2, label="Allreduce's loss to +1%")
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per worker (log scale)")
    ax.set_ylabel("final validation bits per byte (lower is better)")
    ax.set_title("GPT tiny on the whole KJV, 4 workers, 3,360 steps a worker: loss against bytes")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(figure) or ".", exist_ok=True)
    fig.savefig(figure, dpi=110)
    print(f"\nfrontier plot: {figure}")


def main() -> None:
    global RESULTS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("tune", "trend", "seeds", "lookahead", "long", "ending", "best-seeds", "all"),
                   default="all", help="best-seeds: SparseLoCo's best ending and Allreduce on seeds 3 and 4")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="put every new run on this device (cuda: the workers share it through gloo)")
    p.add_argument("--parallel", type=int, default=1, help="runs at once in the ending phase (a machine with cores to spare)")
    p.add_argument("--results", default=RESULTS, help="where finished runs' records are kept (committed)")
    p.add_argument("--out", default="runs/lm_study", help="where the runs go (kept; the script resumes from it)")
    p.add_argument("--figure", default="benchmarks/figures/lm_frontier.png")
    p.add_argument("--report", action="store_true", help="only report what has finished")
    p.add_argument("--collect", action="store_true", help="copy every finished run's records into "
                   "benchmarks/results/lm_study (done after each run anyway), then report")
    args = p.parse_args()
    RESULTS = args.results
    if args.device:
        DEVICE.extend(["--set", f"train.device={args.device}"])  # ranks sharing a GPU: the auto backend is gloo
    if args.collect:
        for path in sorted(os.listdir(args.out)) if os.path.isdir(args.out) else []:
            full = os.path.join(args.out, path)
            length = re.search(r"_epochs-(\d+)$", path)
            epochs = int(length.group(1)) if length else 4
            if finished(full, epochs):
                keep(full)
        args.report = True
    t0 = time.time()
    if not args.report:
        if args.phase in ("tune", "all"):
            for _family, spec, lr in TUNE[:CORE]:
                train(args.out, spec, lr, 0)
        if args.phase in ("trend", "all"):
            for spec, lr in TREND:
                for epochs in TREND_EPOCHS:
                    train(args.out, spec, lr, 0, epochs=epochs)
        if args.phase in ("lookahead", "all"):
            for _name, spec, lr in LOOKAHEAD:
                train(args.out, spec, lr, 0, workers=1, epochs=1)
        if args.phase in ("tune", "all"):
            for _family, spec, lr in TUNE[CORE:CORE + 4]:  # the rates
                train(args.out, spec, lr, 0)
        if args.phase in ("seeds", "all"):  # is each family's gap to Allreduce more than the seeds' spread?
            seeds(args.out, ("allreduce", "diloco", "sparseloco"))
        if args.phase in ("long", "all"):
            for spec, lr in LONG:
                train(args.out, spec, lr, 0, epochs=LONG_EPOCHS)
        if args.phase in ("tune", "all"):
            for _family, spec, lr in TUNE[CORE + 4:]:
                train(args.out, spec, lr, 0)
        if args.phase in ("seeds", "all"):
            seeds(args.out)
        if args.phase in ("ending", "all"):
            ending(args.out, args.parallel)
        if args.phase in ("best-seeds", "all"):
            for seed in MORE_SEEDS:
                for spec, lr in (BEST, REFERENCE):
                    train(args.out, spec, lr, seed)
        print(f"\nstudy wall time this call: {(time.time() - t0) / 60:.1f} min")
    if args.phase in ("ending", "best-seeds"):
        ending_report(args.out)
    else:
        report(args.out, args.figure)
        ending_report(args.out)


if __name__ == "__main__":
    main()
