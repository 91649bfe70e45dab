"""The scale ladder (issue 54): how far each method's loss is from Allreduce's, and at what bytes, per
model size, with every setting chosen on one set of seeds and every published gap measured on others.

The workload is the lm study's (benchmarks/lm_study.py) at each GPT size: byte-level GPT, the WHOLE KJV
text (4.3 MB, 80/10/10 split), context 64, batch 16 a worker, 4 workers, 4 epochs (3,360 inner steps a
worker), AdamW (weight decay 0.1, betas 0.9/0.95) with a quarter-epoch warm-up and cosine decay, the
rate not scaled with the workers. The same samples for every method (same steps, batch and workers).

The protocol, which keeps choosing and judging apart:

  choose    every candidate setting of a family runs on seed 0 (CHOOSE_SEED); the family's setting is
            the one with the lowest final validation bits per byte there. Rates are bracketed: when
            the best rate of the best setting is the highest (lowest) one tried, the next rate up
            (down, a factor of 2) is tried too, until the best has a worse rate on both sides or
            MAX_RATES rates are tried. Selection reads the validation split, never the test split.
  held out  the chosen setting of every family runs on seeds 10, 11 and 12 (HELD_OUT), which informed
            no choice; every gap this script calls published is the mean over them: mean(method) /
            mean(Allreduce) - 1, and per seed the paired gap. A family tried again after those seeds
            judged an earlier form of it (sparseloco-1000x-own) is judged on seeds 13, 14 and 15
            (RETRY_HELD_OUT), with Allreduce's runs on them: the seeds that prompted the retry
            inform none of its figures.
  in-sample the chosen setting on seeds 1 and 2 too (IN_SAMPLE, with seed 0: the figure a study that
            publishes on its choosing seeds would quote), run last.

Why not `lowband compare --tune` for the choosing: its axis search over a list of rates is this bracket
within the list, but it cannot extend past the list's ends, and its trials live in one comparison
directory. The ladder's queue must stop and resume run by run across sessions (a `small` run is 20-40
minutes on 2 cores), reuse `tiny`'s choosing runs from the lm study, and keep each run's records for
ladder.csv. Where a user can afford it, `compare --tune optim.lr=... --tune-on 0 --seeds 10,11,12` chooses
on seed 0's runs and publishes on the seeds it names, the same protocol in one command.

Families: Allreduce (the reference, its rate bracketed); DiLoCo (fp32, tau 16, outer lr 1.0, Nesterov 0.9,
the lm study's best at `tiny`); SparseLoCo (tau 8, 1/64 of each 4,096-chunk, 2-bit values, outer lr 3:
about 580x fewer bytes); SparseLoCo at >= 1,000x (tau 16 at 1/64, tau 8 at 1/128: the same recipe, each
run at SparseLoCo's chosen rate and not bracketed: a rate not tuned for the saver can only widen its gap,
so a gap within 1% measured this way is not flattered; it saves ~45 min a size at `small` on 2 cores);
the same two settings with their own rate bracketed (sparseloco-1000x-own: the retry, after the first
missed the goal at `small` held out; its seed-0 runs at the rate both share are the first's runs);
DiLoCo at its paper's outer step (diloco-0.7: outer lr 0.7, Nesterov 0.9; its own inner rate bracketed,
judged on seeds 13-15, added after outer lr 1.0 gained nothing from size at `small`'s seed 0).
Held-out runs go seed by seed (Allreduce then the 1,000x setting on seed 10, then 11, 12), so a stopped
queue leaves whole pairs; SparseLoCo's ~580x setting is judged after them.

The `tiny` rung reuses the lm study's seed-0 runs (benchmarks/results/lm_study/, the same command line):
those runs chose its settings, so only its held-out and missing runs are new.

Every finished run's per-epoch records are copied to benchmarks/results/ladder/SIZE/ (committed; a
diverged or failed run's partial records too, with a .failed file saying why), so the report and the
queue resume from there without the run directories; `benchmarks/results/ladder.csv` lists every run
the ladder uses, one row each. Each kept record names where it trained ("device": "cpu" or the GPU's name;
records without it trained on the 2-core CPU): a pair can mix the two when a GPU lease ended mid-pair
(the same seed, data and steps; the float rounding differs), and the report says so beside the pair.
Each also names its train.precision ("precision"; records without it trained in fp32). A size's runs share
one precision, so its choosing and judging runs compare like with like: --precision auto (the default)
keeps the precision of a size's committed records, and a size with none trains in bf16 on a GPU (autocast:
what a GPU user trains in) and in fp32 on the CPU (where this machine's bf16 is 7.7x slower,
benchmarks/results/precision/); a --precision that differs from a size's records is refused.

Run:      python benchmarks/ladder.py --run [--sizes small,tiny,nano] [--out runs/ladder]
Report:   python benchmarks/ladder.py --report [--publish] [--figure PNG]
          (every size with committed records, --sizes first). It writes ladder.csv, ladder.json and
          ladder.png into --out; --publish writes them where they are committed instead
          (benchmarks/results/ladder.csv, and ladder.json beside it that every report quotes,
          benchmarks/figures/ladder.png). A run lowband refuses (exit 2) stops the queue at once.
Plan:     python benchmarks/ladder.py --plan   (the runs still to do, in the order --run takes them)
GPU:      python benchmarks/ladder.py --run --sizes medium,large --device cuda --parallel 4
          (4 runs at once, each 4 workers sharing the GPU through gloo); benchmarks/device_ladder.sh runs
          it in the calls of a lent GPU machine and brings the records back
          --families diloco,...: only those families' runs (a rung finished out of the usual order)
Time on the 2-core CPU machine, one run alone: nano ~2 min, tiny ~6.5, small 20-40. On an H200, six runs
side by side: small ~2.5-3.5 min, medium ~5.5.
Safe to stop and start again: SIGTERM reaches every run (each keeps its last checkpoint and resumes from
it on the next --run); no run starts after it. To train every run with
one version of lowband while the tree changes, run it with PYTHONPATH=<a worktree of that commit>/src
(and LOWBAND_COMMIT=<its hash>, which the report prints).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from common import commit, method_flags

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "ladder")
LM_STUDY = os.path.join(HERE, "results", "lm_study")  # tiny's choosing runs
CSV = os.path.join(HERE, "results", "ladder.csv")
SIZES = ("nano", "tiny", "small", "medium", "large")
CHOOSE_SEED = 0
IN_SAMPLE = (1, 2)
HELD_OUT = (10, 11, 12)
RETRY_HELD_OUT = (13, 14, 15)  # a family tried again after seeds 10-12 judged it is judged on these
EPOCHS = 4
WORKERS = 4
MARGIN = 0.01  # "within 1%"
MAX_RATES = 5  # a bracket stops after this many rates of one setting
BASE = ["--dataset", "text", "--model", "gpt", "--set", "data.max_bytes=0", "--set", "data.context=64",
        "--batch-size", "16", "--set", "optim.name='adamw'", "--set", "optim.weight_decay=0.1",
        "--set", "optim.warmup_epochs=0.25", "--set", "optim.lr_scaling='none'"]
DEVICE: list[str] = []  # --set options that put the runs on a device (--device)
PRECISION: dict[str, str] = {}  # each size's train.precision (--precision; precision_for)
STOPPING = threading.Event()  # set by SIGTERM: start no more runs
LIVE: set[subprocess.Popen] = set()  # the runs training now
REFUSED: list[str] = []  # why the queue stopped at a run lowband refused
ONLY: set[str] = set()  # --families: the queue takes only these families' runs (empty: all)

S8 = "sparseloco:density=0.015625:codec=lut2:tau=8:outer_lr=3.0"  # ~580x fewer bytes than Allreduce
# >= 1,000x: half the rounds, or half the coordinates (1-bit values alone save 1 bit of a kept value's ~14:
# 1.08x, so they reach no 1,000x by themselves)
PUSH = ["sparseloco:density=0.015625:codec=lut2:tau=16:outer_lr=3.0",
        "sparseloco:density=0.0078125:codec=lut2:tau=8:outer_lr=3.0"]
DILOCO = "diloco:tau=16:outer_lr=1.0"  # the lm study's DiLoCo (outer Nesterov 0.9 at 1.0: 10x the mean change)
DILOCO_07 = "diloco:tau=16:outer_lr=0.7"  # DiLoCo's paper's outer step (Nesterov 0.9 at 0.7)


@dataclass(frozen=True)
class Family:
    """A method's candidates at each size: settings and the inner rates each starts from."""

    name: str
    specs: tuple[str, ...]
    rates: dict[str, tuple[float, ...]]  # size -> starting rates (None-size: follows another family)
    rates_from: str = ""  # the family whose chosen rate this one starts from ('' : its own rates)
    held_out: tuple[int, ...] = HELD_OUT  # the seeds it is judged on (Allreduce runs on them too)
    about: str = ""  # what the figure's legend says beside the name


FAMILIES = (
    Family("allreduce", ("allreduce",), {"nano": (0.032, 0.016), "tiny": (0.004, 0.008, 0.016, 0.032),
                                         "small": (0.016, 0.008), "medium": (0.008, 0.004), "large": (0.004, 0.002)}),
    Family("sparseloco", (S8,), {"nano": (0.032, 0.016), "tiny": (0.008, 0.012, 0.016),
                                 "small": (0.008, 0.016), "medium": (0.008, 0.004), "large": (0.004, 0.002)},
           about="tau 8, 1/64, 2 bits"),
    Family("sparseloco-1000x", tuple(PUSH), {}, rates_from="sparseloco", about="SparseLoCo's rate"),
    # the same settings with their own rate, bracketed on seed 0; judged on seeds 13-15, because seeds 10-12
    # informed the decision to try again (they showed the unbracketed rate's +1.46% at `small`)
    Family("sparseloco-1000x-own", tuple(PUSH), {"nano": (0.032, 0.016), "tiny": (0.016, 0.032),
                                                 "small": (0.008, 0.016), "medium": (0.008, 0.004),
                                                 "large": (0.004, 0.002)}, held_out=RETRY_HELD_OUT,
           about="its own rate"),
    Family("diloco", (DILOCO,), {"nano": (0.016, 0.008), "tiny": (0.004, 0.008), "small": (0.008, 0.004),
                                 "medium": (0.004, 0.002), "large": (0.002, 0.001)}, about="outer lr 1.0, fp32"),
    # the paper's outer rate, its own inner rate bracketed on seed 0. Added after `small`'s choosing runs put
    # outer lr 1.0 at +10.8% (seed 0) and the lm study's one-worker lookahead preferred 0.7 (2.036 against
    # 2.186 bpb); judged on seeds 13-15, because seeds 10-12 had judged outer lr 1.0 at `nano` by then
    Family("diloco-0.7", (DILOCO_07,), {"nano": (0.016, 0.008), "tiny": (0.004, 0.008), "small": (0.008, 0.004),
                                        "medium": (0.004, 0.002), "large": (0.002, 0.001)}, held_out=RETRY_HELD_OUT,
           about="outer lr 0.7, fp32"),
)
REFERENCE = "allreduce"


@dataclass(frozen=True)
class Job:
    size: str
    spec: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        """The lm study's run name (so tiny's runs there are found): SPEC_lr-LR_seed-S, ':' -> '_', '=' -> '-'."""
        return (f"{self.spec} lr={self.lr:g}".replace(":", "_").replace("=", "-").replace(" ", "_")
                + f"_seed-{self.seed}")


# ---- records ---------------------------------------------------------------------------------------

def kept_path(job: Job) -> str:
    return os.path.join(RESULTS, job.size, job.name + ".jsonl")


def sources(job: Job, out: str) -> list[str]:
    """Where a job's records may be: its run directory, the ladder's committed copy, the lm study's (tiny)."""
    paths = [os.path.join(out, job.size, job.name, "metrics.jsonl"), kept_path(job)]
    if job.size == "tiny":
        paths.append(os.path.join(LM_STUDY, job.name + ".jsonl"))
    return paths


def read_records(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []


def records(job: Job, out: str) -> tuple[list[dict], str]:
    """The job's per-epoch records and the file they came from (the longest source wins)."""
    found = [(read_records(p), p) for p in sources(job, out)]
    return max(found, key=lambda rp: len(rp[0]))


def failure(job: Job) -> str | None:
    """Why the job failed (a diverged or crashed run), or None."""
    path = kept_path(job)[:-len(".jsonl")] + ".failed"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read().strip() or "failed"


def final(job: Job, out: str) -> dict | None:
    """The job's last record when it finished all EPOCHS, else None."""
    recs, _ = records(job, out)
    return recs[-1] if recs and recs[-1]["epoch"] >= EPOCHS else None


def done(job: Job, out: str) -> bool:
    return final(job, out) is not None or failure(job) is not None


def bpb(job: Job, out: str) -> float:
    """Final validation bits per byte; inf for a failed or unfinished run."""
    rec = final(job, out)
    return rec["val_bpb"] if rec and rec.get("val_bpb") is not None else math.inf


# ---- the protocol ----------------------------------------------------------------------------------

def tried(family: Family, size: str, out: str) -> list[Job]:
    """The family's choosing runs at `size` so far (seed CHOOSE_SEED), brackets included, in run order."""
    rates = family.rates.get(size, ())
    if family.rates_from:
        base = chosen(family_named(family.rates_from), size, out)
        if base is None:
            return []  # known once the family it follows has chosen
        rates = (base.lr,)
    jobs = [Job(size, spec, lr, CHOOSE_SEED) for spec in family.specs for lr in rates]
    if family.rates_from:
        return jobs  # the parent's bracketed rate, unbracketed here: a handicap for the saver, never a help
    return jobs + _brackets(jobs, size, out)


def _brackets(jobs: list[Job], size: str, out: str) -> list[Job]:
    """The rates added to bracket the best setting's, while every run so far has finished."""
    added: list[Job] = []
    while all(done(j, out) for j in jobs + added):
        best = min(jobs + added, key=lambda j: bpb(j, out), default=None)
        if best is None or not math.isfinite(bpb(best, out)):
            return added
        rates = sorted({j.lr for j in jobs + added if j.spec == best.spec})
        if len(rates) >= MAX_RATES:
            return added
        nxt = best.lr * 2 if best.lr == rates[-1] else best.lr / 2 if best.lr == rates[0] else None
        if nxt is None:
            return added
        added.append(Job(size, best.spec, round(nxt, 6), CHOOSE_SEED))
    return added


def family_named(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def chosen(family: Family, size: str, out: str) -> Job | None:
    """The family's setting at `size` (seed CHOOSE_SEED), once every choosing run has finished; else None."""
    jobs = tried(family, size, out)
    if not jobs or not all(done(j, out) for j in jobs):
        return None
    best = min(jobs, key=lambda j: bpb(j, out))
    return best if math.isfinite(bpb(best, out)) else None


def stage_jobs(size: str, stage: str, out: str, families: tuple[str, ...] | None = None) -> list[Job]:
    """The jobs of one stage at one size that are known now (later ones appear as earlier ones finish), of
    `families` (None: all)."""
    chosen_families = [f for f in FAMILIES if families is None or f.name in families]
    if stage == "choose":
        return [j for f in chosen_families for j in tried(f, size, out)]
    if stage == "in_sample":
        picks = [chosen(f, size, out) for f in chosen_families]
        return [Job(size, p.spec, p.lr, s) for s in IN_SAMPLE for p in picks if p is not None]
    ref = chosen(family_named(REFERENCE), size, out)
    jobs: dict[Job, None] = {}
    for f in chosen_families:
        pick = chosen(f, size, out)
        for s in f.held_out if pick is not None else ():
            if ref is not None and f.held_out != HELD_OUT:
                jobs.setdefault(Job(size, ref.spec, ref.lr, s))  # Allreduce on the family's own seeds, paired
            jobs.setdefault(Job(size, pick.spec, pick.lr, s))
    return sorted(jobs, key=lambda j: j.seed)  # seed by seed, so a stopped queue leaves whole pairs


#: the order of the work: at every size in turn, the reference and the saver users are told of, chosen then
#: judged; then, at every size in turn, the push past 1,000x and DiLoCo; the in-sample seeds last (at `small`
#: the push ran before the saver's held-out seeds: the issue's goal turns on it)
CORE: list[tuple[str, tuple[str, ...]]] = [
    ("choose", ("allreduce", "sparseloco")),
    ("held_out", ("allreduce", "sparseloco")),
]
MORE: list[tuple[str, tuple[str, ...]]] = [
    ("choose", ("sparseloco-1000x",)),
    ("held_out", ("sparseloco-1000x",)),
    ("choose", ("sparseloco-1000x-own",)),
    ("held_out", ("sparseloco-1000x-own",)),
    ("choose", ("diloco",)),
    ("held_out", ("diloco",)),
    ("choose", ("diloco-0.7",)),
    ("held_out", ("diloco-0.7",)),
]


def order(sizes: list[str]) -> list[tuple[str, str, tuple[str, ...] | None]]:
    """(size, stage, families) in the order --run takes them: every size's core phases, then every size's
    other phases, then the in-sample seeds; of the families in ONLY when --families named some."""
    stages: list[tuple[str, str, tuple[str, ...] | None]] = (
        [(size, stage, fams) for size in sizes for stage, fams in CORE]
        + [(size, stage, fams) for size in sizes for stage, fams in MORE]
        + [(size, "in_sample", None) for size in sizes])
    if not ONLY:
        return stages
    return [(size, stage, tuple(f.name for f in FAMILIES if f.name in ONLY and (fams is None or f.name in fams)))
            for size, stage, fams in stages]


def next_job(sizes: list[str], out: str) -> Job | None:
    """The first job not yet done, in `order`."""
    for size, stage, fams in order(sizes):
        for job in stage_jobs(size, stage, out, fams):
            if not done(job, out):
                return job
    return None


# ---- running -----------------------------------------------------------------------------------------

def command(job: Job, run_dir: str) -> list[str]:
    if os.path.exists(os.path.join(run_dir, "config.toml")):
        return ["--resume", run_dir]
    return [*method_flags(job.spec, round_evals=False), *BASE, "--set", f"model.size='{job.size}'", "--workers", str(WORKERS),
            "--epochs", str(EPOCHS), "--set", f"optim.lr={job.lr}", "--seed", str(job.seed), "--run-dir", run_dir,
            *DEVICE, "--set", f"train.precision='{PRECISION.get(job.size, 'fp32')}'"]


def train(job: Job, out: str) -> int:
    """One run, resumed if an earlier call was stopped; its records kept when it ends, finished or failed;
    its exit code. A refusal (exit 2: lowband found the request wrong) stops the queue: it would be refused
    again, so it is never retried."""
    run_dir = os.path.join(out, job.size, job.name)
    if os.path.isdir(run_dir) and not read_records(os.path.join(run_dir, "metrics.jsonl")) and not os.path.exists(
            os.path.join(run_dir, "checkpoints")):
        shutil.rmtree(run_dir)  # stopped before its first checkpoint: start again
    args = command(job, run_dir)
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] {job.size} {job.spec} lr={job.lr:g} seed {job.seed}: "
          f"lowband train {' '.join(args)}", flush=True)
    with subprocess.Popen([sys.executable, "-m", "lowband", "train", "-q", *args]) as proc:
        LIVE.add(proc)
        try:
            code = proc.wait()
        finally:
            LIVE.discard(proc)
    print(f"  exit {code} after {time.time() - t0:.0f} s", flush=True)
    if code == 2:
        REFUSED.append(f"lowband refused {job.size} {job.spec} lr={job.lr:g} seed {job.seed} (exit 2; its line is "
                       "above): fix the request, then --run again")
        STOPPING.set()
        return code
    keep(job, out, code, run_dir)
    return code


def stop_runs(signum: int, frame: object) -> None:
    """SIGTERM: pass it on to every run (each stops its workers and keeps its last checkpoint, so a later
    call resumes it) and start no more. Without this the runs would go on, orphaned, after the queue ends."""
    STOPPING.set()
    for proc in list(LIVE):
        proc.send_signal(signal.SIGTERM)


def keep(job: Job, out: str, code: int, run_dir: str) -> None:
    """Copy the run's records into RESULTS (per-tag byte tables left out); a run that ended without its
    last epoch for a reason that will not go away (divergence: exit 4) is marked failed."""
    recs = read_records(os.path.join(run_dir, "metrics.jsonl"))
    os.makedirs(os.path.join(RESULTS, job.size), exist_ok=True)
    device, precision = trained_on(run_dir) if recs else ("cpu", "fp32")
    if recs:
        with open(kept_path(job), "w") as f:
            for r in recs:
                f.write(json.dumps({**{k: v for k, v in r.items() if k != "bytes"}, "device": device,
                                    "precision": precision}) + "\n")
    if code == 4 or (code == 0 and (not recs or recs[-1]["epoch"] < EPOCHS)):
        why = divergence(run_dir) or f"exit {code}"
        with open(kept_path(job)[:-len(".jsonl")] + ".failed", "w") as f:
            f.write(why + "\n")


def keep_finished(sizes: list[str], out: str) -> None:
    """Copy the records of every run directory that finished without its copy kept (its queue was stopped)."""
    for job in every_job(sizes, out):
        run_dir = os.path.join(out, job.size, job.name)
        recs = read_records(os.path.join(run_dir, "metrics.jsonl"))
        if recs and recs[-1]["epoch"] >= EPOCHS and len(read_records(kept_path(job))) < len(recs):
            keep(job, out, 0, run_dir)


def trained_on(run_dir: str) -> tuple[str, str]:
    """Where a run trained ("cpu" or the GPU's name: its train.device, with "auto" resolved as the run
    resolved it, since a run directory lives on the machine that trained it) and in what train.precision.
    Records kept without these keys were trained on the 2-core CPU, in fp32."""
    import tomllib
    import torch

    with open(os.path.join(run_dir, "config.toml"), "rb") as f:
        train = tomllib.load(f).get("train", {})
    device, precision = train.get("device", "auto"), train.get("precision", "fp32")
    if device == "cpu" or not torch.cuda.is_available():
        return "cpu", precision
    return torch.cuda.get_device_name(), precision


def committed_precision(size: str) -> str | None:
    """The train.precision of a size's committed records (None: it has none); records without the key: fp32."""
    for path in sorted(glob.glob(os.path.join(RESULTS, size, "*.jsonl"))):
        recs = read_records(path)
        if recs:
            return recs[-1].get("precision", "fp32")
    return None


def precision_for(size: str, given: str, device: str) -> str:
    """A size's precision for --precision `given` (module doc): its records' own, else bf16 on a GPU and fp32
    on the CPU; ValueError when `given` differs from its records'."""
    kept = committed_precision(size)
    if given != "auto" and kept is not None and given != kept:
        raise ValueError(f"--precision {given}: {size}'s committed records trained in {kept}, and a size's runs "
                         f"share one precision (give --precision auto or {kept})")
    if given != "auto":
        return given
    return kept or ("bf16" if device == "cuda" else "fp32")


def divergence(run_dir: str) -> str | None:
    """The first line of a diverged rank's note (diverged.rankN.txt), if any."""
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("diverged"):
            with open(os.path.join(run_dir, name)) as f:
                return (f.read().splitlines() or ["diverged"])[0]
    return None


def run_all(sizes: list[str], out: str, parallel: int) -> None:
    """Take the next job until none is left or SIGTERM came; `parallel` at a time (each its own group of
    workers)."""
    keep_finished(sizes, out)
    run_queue(sizes, out, parallel)
    if REFUSED:
        sys.exit(f"ladder.py: error: {REFUSED[0]}")
    if STOPPING.is_set():
        print("stopped by SIGTERM: a run that was training resumes from its last checkpoint next time", flush=True)


def run_queue(sizes: list[str], out: str, parallel: int) -> None:
    """The queue of run_all."""
    if parallel <= 1:
        while not STOPPING.is_set() and (job := next_job(sizes, out)) is not None:
            train(job, out)
        return
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    running: dict = {}
    with ThreadPoolExecutor(parallel) as pool:
        while True:
            busy = set(running.values())
            jobs = list(dict.fromkeys(j for size, stage, fams in order(sizes) for j in stage_jobs(size, stage, out, fams)
                                      if not done(j, out) and j not in busy))  # a run two families share, once
            for job in [] if STOPPING.is_set() else jobs[:parallel - len(running)]:
                running[pool.submit(train, job, out)] = job
            if not running:
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                running.pop(fut)


# ---- what it shows -------------------------------------------------------------------------------

def params_of(size: str) -> int:
    """The GPT's parameter count at `size` on the KJV's byte vocabulary (as the runs' banner says)."""
    from lowband.models.gpt import GPT
    from lowband.models.gpt import SIZES as SHAPES

    return sum(p.numel() for p in GPT(256, 64, SHAPES[size]).parameters())


def every_job(sizes: list[str], out: str) -> list[Job]:
    """Every job the ladder knows now at `sizes`, choosing runs first, each once."""
    seen: dict[Job, None] = {}
    for size in sizes:
        for stage in ("choose", "in_sample", "held_out"):
            for job in stage_jobs(size, stage, out):
                seen.setdefault(job)
    return list(seen)


def family_of(job: Job) -> str:
    """The family a run belongs to: of those listing its setting, the one judged on its seed, else the first
    (a seed-0 run two families share is listed under the first)."""
    names = [f for f in FAMILIES if job.spec in f.specs]
    return next((f.name for f in names if job.seed in f.held_out), names[0].name)


def write_csv(sizes: list[str], out: str) -> int:
    """ladder.csv: one row per run that ended (finished or failed), its committed records' path beside it."""
    rows = []
    for job in every_job(sizes, out):
        recs, path = records(job, out)
        why = failure(job)
        if not recs and why is None:
            continue
        last = recs[-1] if recs else {}
        finished = bool(recs) and last["epoch"] >= EPOCHS
        if not finished and why is None and not os.path.exists(kept_path(job)):
            continue  # still training (its records are kept, and listed, once it ends)
        rows.append({"size": job.size, "params": PARAMS[job.size], "method": family_of(job), "spec": job.spec,
                     "lr": f"{job.lr:g}", "seed": job.seed, "epochs": last.get("epoch", 0),
                     "val_bpb": f"{last['val_bpb']:.6f}" if finished else (why or "unfinished"),
                     "bytes_sent_per_worker": f"{last.get('bytes_sent_per_worker', 0):.0f}",
                     "records": os.path.relpath(committed(job, path), os.path.dirname(HERE)),
                     "device": device_of(last), "precision": last.get("precision", "fp32")})
    with open(CSV, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["size"])
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def committed(job: Job, path: str) -> str:
    """The committed copy of a job's records (the run directory's file is not committed)."""
    return path if path.startswith(HERE) else kept_path(job)


PARAMS: dict[str, int] = {}


@dataclass
class Verdict:
    """A family's chosen setting at one size, judged on the held-out seeds against Allreduce's."""

    family: str
    job: Job
    choose_bpb: float  # seed CHOOSE_SEED
    in_sample: list[float]  # seeds CHOOSE_SEED and IN_SAMPLE, those finished
    held: dict[int, dict]  # seed -> final record
    ref_held: dict[int, dict]  # Allreduce's, on the same seeds
    seeds: tuple[int, ...] = HELD_OUT  # the family's held-out seeds

    def gap(self, seeds: list[int] | None = None) -> float | None:
        """The gap of the means over the held-out seeds both finished, in %."""
        seeds = [s for s in (seeds or self.seeds) if s in self.held and s in self.ref_held]
        if not seeds:
            return None
        return 100 * (statistics.mean(self.held[s]["val_bpb"] for s in seeds)
                      / statistics.mean(self.ref_held[s]["val_bpb"] for s in seeds) - 1)

    def by_seed(self) -> dict[int, float]:
        """The paired gap (%) on each held-out seed both finished."""
        return {s: 100 * (self.held[s]["val_bpb"] / self.ref_held[s]["val_bpb"] - 1)
                for s in self.seeds if s in self.held and s in self.ref_held}

    def paired(self) -> list[float]:
        return list(self.by_seed().values())

    def ratio(self) -> float | None:
        seeds = [s for s in self.seeds if s in self.held and s in self.ref_held]
        if not seeds:
            return None
        return (statistics.mean(self.ref_held[s]["bytes_sent_per_worker"] for s in seeds)
                / statistics.mean(self.held[s]["bytes_sent_per_worker"] for s in seeds))


def verdicts(size: str, out: str) -> list[Verdict]:
    ref = chosen(family_named(REFERENCE), size, out)
    found = []
    for family in FAMILIES:
        pick = chosen(family, size, out)
        if pick is None:
            continue
        ref_held = {s: r for s in family.held_out if ref and (r := final(Job(size, ref.spec, ref.lr, s), out))}
        runs = {s: final(Job(size, pick.spec, pick.lr, s), out) for s in (CHOOSE_SEED, *IN_SAMPLE, *family.held_out)}
        found.append(Verdict(family.name, pick, bpb(pick, out),
                             [runs[s]["val_bpb"] for s in (CHOOSE_SEED, *IN_SAMPLE) if runs[s]],
                             {s: runs[s] for s in family.held_out if runs[s]}, ref_held, family.held_out))
    return found


def short(spec: str) -> str:
    return spec.replace("density=0.015625", "1/64").replace("density=0.0078125", "1/128").replace(":codec=", " ")


def fewer(ratio: float | None) -> str:
    """A byte ratio rounded down, so a saving is never overstated against a goal (999.8x prints 999)."""
    return "-" if ratio is None else f"{math.floor(ratio):,}x"


def tenth_down(ratio: float) -> float:
    """A byte ratio as the summaries store it: a tenth, rounded down, so that `fewer` of it is `fewer` of the ratio."""
    return math.floor(ratio * 10) / 10


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}%"


def size_report(size: str, out: str) -> list[Verdict]:
    """Per size: the choosing runs, then each family's verdict (in-sample and held-out), then the
    held-out per-epoch gaps of the savers (what stops them)."""
    found = verdicts(size, out)
    print(f"\n### GPT {size} ({PARAMS[size]:,} parameters)\n")
    print(f"Trained on: {trained_where(size, out)}\n")
    print(f"Choosing runs (seed {CHOOSE_SEED}), final validation bits per byte:\n")
    for family in FAMILIES:
        jobs = tried(family, size, out)
        cells = []
        for j in jobs:
            why = failure(j)
            cells.append(f"{short(j.spec)} lr={j.lr:g}: " + (f"{bpb(j, out):.4f}" if math.isfinite(bpb(j, out))
                                                               else why or "to run"))
        if cells:
            print(f"- {family.name}: " + "; ".join(cells))
    if not found:
        return found
    print("\n| method | chosen setting | lr | in-sample (seeds 0-2) | vs Allreduce | held-out "
          "| vs Allreduce (held out) | per held-out seed | MB sent/worker | fewer bytes | within 1% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ref_in = next((v.in_sample for v in found if v.family == REFERENCE), [])
    for v in found:
        held = [v.held[s]["val_bpb"] for s in v.seeds if s in v.held]
        n = min(len(v.in_sample), len(ref_in))
        in_gap = 100 * (statistics.mean(v.in_sample[:n]) / statistics.mean(ref_in[:n]) - 1) if n else None
        sent = statistics.mean(r["bytes_sent_per_worker"] for r in v.held.values()) if v.held else None
        gap = v.gap()
        within = "-" if gap is None or len(v.paired()) < len(v.seeds) else "yes" if gap <= 100 * MARGIN else "no"
        print(f"| {v.family} | {short(v.job.spec)} | {v.job.lr:g} | {_mean_sd(v.in_sample)} | {pct(in_gap)} | "
              f"{_mean_sd(held)} | {pct(gap)} | {', '.join(f'{s}: {pct(g)}' for s, g in v.by_seed().items()) or '-'} | "
              f"{'-' if sent is None else f'{sent / 1e6:,.2f}'} | {fewer(v.ratio())} | {within} |")
    print("\nHeld-out seeds per epoch, the gap to Allreduce of the same seed (validation bits per byte), then "
          "the gap in training loss:\n")
    for v in found:
        if v.family == REFERENCE:
            continue
        for s, gaps in epoch_gaps(size, v, out, "val_bpb").items():
            fit = epoch_gaps(size, v, out, "train_loss")[s]
            print(f"- {v.family} seed {s}{where(v, s)}: val {' '.join(f'{g:+.1f}%' for g in gaps)}; "
                  f"train loss {' '.join(f'{g:+.1f}%' for g in fit)}")
    return found


def device_of(record: dict) -> str:
    """Where a kept record's run trained (records kept before the key existed: the 2-core CPU)."""
    return record.get("device", "cpu")


def trained_where(size: str, out: str) -> str:
    """How many of a size's finished runs trained on each device ("cpu": the 2-core CPU)."""
    counts: dict[str, int] = {}
    for job in every_job([size], out):
        if final(job, out):
            device = device_of(records(job, out)[0][-1])
            counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"{d} ({n} runs)" for d, n in sorted(counts.items())) or "nothing yet"


def where(v: Verdict, seed: int) -> str:
    """A pair trained on two devices says so (the same seed, data and steps; float rounding differs)."""
    mine, ref = (device_of(r) for r in (v.held[seed], v.ref_held[seed]))
    return "" if mine == ref else f" ({mine}; Allreduce's on {ref})"


def epoch_gaps(size: str, v: Verdict, out: str, key: str) -> dict[int, list[float]]:
    """Per held-out seed both runs finished, the family's gap to Allreduce of the same seed after each epoch,
    in % of `key` (val_bpb or train_loss)."""
    gaps = {}
    for s in v.seeds:
        mine, ref = Job(size, v.job.spec, v.job.lr, s), Job(size, *_ref_setting(size, out), s)
        run, refs = records(mine, out)[0], records(ref, out)[0]
        if final(mine, out) and final(ref, out) and run and refs:
            gaps[s] = [100 * (r[key] / q[key] - 1) for r, q in zip(run, refs, strict=False)]
    return gaps


def _ref_setting(size: str, out: str) -> tuple[str, float]:
    ref = chosen(family_named(REFERENCE), size, out)
    assert ref is not None
    return ref.spec, ref.lr


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {sd:.4f} ({len(values)})"


def ladder_table(found: dict[str, list[Verdict]]) -> None:
    """The gap to Allreduce (held out) against parameters, per method, with the bytes ratio."""
    names = [f.name for f in FAMILIES if f.name != REFERENCE]
    print("\n### The ladder: held-out gap to Allreduce (seeds 10-12; 13-15 for a family tried again) and bytes "
          "ratio, per size\n")
    print("| size | parameters | Allreduce (val bpb) | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for size, vs in found.items():
        by = {v.family: v for v in vs}
        ref = by.get(REFERENCE)
        ref_cell = "-" if not ref or not ref.held else f"{statistics.mean(r['val_bpb'] for r in ref.held.values()):.4f}"
        cells = [f"{pct(by[n].gap())} at {fewer(by[n].ratio())}" if n in by and by[n].gap() is not None else "-"
                 for n in names]
        print(f"| {size} | {PARAMS[size]:,} | {ref_cell} | " + " | ".join(cells) + " |")


def in_sample_gap(v: Verdict, vs: list[Verdict]) -> tuple[float, int] | None:
    """The family's gap to Allreduce on the in-sample seeds both finished (%, how many), or None."""
    ref = next((r for r in vs if r.family == REFERENCE), None)
    n = min(len(v.in_sample), len(ref.in_sample)) if ref else 0
    return (100 * (statistics.mean(v.in_sample[:n]) / statistics.mean(ref.in_sample[:n]) - 1), n) if ref and n else None


def plot(found: dict[str, list[Verdict]], figure: str, out: str) -> None:
    """Two panels, one colour per family and one legend for both. Left: the gap against parameters,
    held-out (filled, error bar over the seeds, labelled with the bytes ratio) and in-sample (hollow,
    dashed: the seeds that chose the setting). Right: the held-out gap after each epoch, mean over the
    seeds, one line style per size: whether it is still closing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, (ax, per_epoch) = plt.subplots(1, 2, figsize=(12, 5.4), gridspec_kw={"width_ratios": [3, 2]})
    styles = dict(zip(found, ("-", "--", ":", "-.", (0, (1, 3))), strict=False))
    labels: list[tuple[float, float, str, str]] = []  # x, y, text, colour: placed once the axes are final
    families = []
    for i, family in enumerate(f for f in FAMILIES if f.name != REFERENCE):
        color = f"C{i}"
        mine = [(size, v, vs) for size, vs in found.items() for v in vs if v.family == family.name]
        if _plot_family(ax, color, mine, [s for s, vs in found.items() if vs], labels):
            about = f" ({family.about})" if family.about else ""
            families.append(Line2D([], [], color=color, marker="o", label=family.name + about))
        for size, v, _ in mine:
            gaps = list(epoch_gaps(size, v, out, "val_bpb").values())
            if gaps and min(map(len, gaps)) > 0:
                n = min(map(len, gaps))
                means = [statistics.mean(g[e] for g in gaps) for e in range(n)]
                per_epoch.plot(range(1, n + 1), means, marker="o", ms=4, color=color, ls=styles[size])
    ax.axhline(0, color="black", lw=0.8)
    ax.axhspan(0, 100 * MARGIN, color="green", alpha=0.08)
    ax.set_xscale("log")
    ax.set_xticks([PARAMS[s] for s in found], [f"{s}\n{PARAMS[s] / 1e3:,.0f} k" for s in found])
    ax.minorticks_off()
    ax.margins(x=0.2)
    ax.set_xlabel("GPT size and parameters")
    ax.set_ylabel("final validation bits per byte vs Allreduce (%)")
    ax.set_title("Gap to Allreduce at equal samples (label: fewer bytes than Allreduce)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(handles=[Line2D([], [], color="grey", marker="o", label="held out: seeds 10-12 (a retry: 13-15), ± sd"),
                       Line2D([], [], color="grey", marker="o", mfc="none", ls="--", label="the choosing seeds"),
                       plt.Rectangle((0, 0), 1, 1, color="green", alpha=0.15, label="within 1%")],
              fontsize=7, loc="upper right")
    _place_labels(ax, labels)
    per_epoch.axhline(0, color="black", lw=0.8)
    per_epoch.axhspan(0, 100 * MARGIN, color="green", alpha=0.08)
    per_epoch.set_xlabel("epoch")
    per_epoch.set_ylabel("validation gap vs Allreduce (%)")
    per_epoch.set_title("Held-out gap after each epoch (mean over seeds): still closing?", fontsize=9)
    per_epoch.xaxis.get_major_locator().set_params(integer=True)
    per_epoch.legend(handles=[Line2D([], [], color="grey", ls=styles[s], label=s) for s in found if found[s]],
                     title="size", fontsize=7, title_fontsize=7, loc="upper right")
    per_epoch.grid(alpha=0.3)
    fig.legend(handles=families, loc="lower center", ncol=min(len(families), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    os.makedirs(os.path.dirname(figure) or ".", exist_ok=True)
    fig.savefig(figure, dpi=110)
    plt.close(fig)
    print(f"\nfigure: {figure}")


def _plot_family(ax, color: str, mine: list, sizes: list[str], labels: list) -> bool:
    """One family's points on the left panel (whether it has any): held-out, its bytes ratio queued in
    `labels`; in-sample hollow. A line joins two sizes only when no size between them lacks the figure
    (a gap, not an interpolation)."""
    order = sorted(PARAMS[s] for s in sizes)
    held = {PARAMS[size]: (v.gap(), statistics.stdev(v.paired()) if len(v.paired()) > 1 else 0.0, v, len(v.paired()))
            for size, v, _ in mine if v.gap() is not None}
    inside = {PARAMS[size]: g for size, v, vs in mine if (g := in_sample_gap(v, vs))}
    if held:
        ys = [held[x][0] if x in held else math.nan for x in order]
        errs = [held[x][1] if x in held else 0.0 for x in order]
        ax.errorbar(order, ys, yerr=errs, marker="o", capsize=3, color=color)
        for x, (y, _, v, n) in held.items():
            seeds = "" if n == len(v.seeds) else f" ({n} of {len(v.seeds)} seeds)"
            labels.append((x, y, f"{fewer(v.ratio())}{seeds}", color))
    if inside:
        ys = [inside[x][0] if x in inside else math.nan for x in order]
        ax.plot(order, ys, marker="o", mfc="none", ls="--", lw=0.9, color=color, alpha=0.7)
    return bool(held or inside)


def _place_labels(ax, labels: list[tuple[float, float, str, str]], gap_pt: float = 9.0) -> None:
    """Each point's label to its right, pushed apart vertically where labels of one size would overlap."""
    by_x: dict[float, list] = {}
    for x, y, text, color in labels:
        by_x.setdefault(x, []).append((y, text, color))
    to_pt = 72 / ax.figure.dpi
    for x, items in by_x.items():
        items.sort(key=lambda item: item[0])
        top = -math.inf  # the height of the label placed last, in points
        for y, text, color in items:
            point = ax.transData.transform((x, y))[1] * to_pt
            top = max(point, top + gap_pt)
            shift = top - point
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(8, shift - 3), fontsize=8, color=color,
                        arrowprops=dict(arrowstyle="-", color=color, lw=0.5, alpha=0.6) if shift > 1 else None)


def measured(sizes: list[str]) -> list[str]:
    """`sizes`, then every other size with committed records (SIZES order): ladder.csv, the figure and the
    summary every report quotes always cover every run, whichever sizes a call runs (a GPU call runs medium alone)."""
    more = [s for s in SIZES if s not in sizes and os.path.isdir(os.path.join(RESULTS, s))]
    PARAMS.update({s: params_of(s) for s in more})
    return sizes + more


def publish_to(out: str, publish: bool) -> None:
    """Where --report writes ladder.csv and ladder.json: the committed places (benchmarks/results/: the
    summary every report quotes) only with --publish; else beside the runs, in --out."""
    global CSV, SUMMARY
    if not publish:
        CSV, SUMMARY = os.path.join(out, "ladder.csv"), os.path.join(out, "ladder.json")


def report(sizes: list[str], out: str, figure: str) -> None:
    sizes = measured(sizes)
    print(f"Scale ladder, commit {commit()}: whole KJV, context 64, batch 16, {WORKERS} workers, {EPOCHS} epochs; "
          f"chosen on seed {CHOOSE_SEED}, judged on seeds {', '.join(map(str, HELD_OUT))} (a family tried again after "
          f"them: on {', '.join(map(str, RETRY_HELD_OUT))})")
    found = {size: size_report(size, out) for size in sizes}
    found = {size: vs for size, vs in found.items() if vs}
    ladder_table(found)
    if found:
        plot(found, figure, out)
        write_summary(found, out)
    print(f"\n{write_csv(sizes, out)} runs listed in {os.path.relpath(CSV)}")


#: what `lowband compare`'s report says of model size (lowband.comparison.scale reads it)
SUMMARY = os.path.join(HERE, "results", "ladder.json")  # a release carries it as package data (setup.py)


def write_summary(found: dict[str, list[Verdict]], out: str) -> None:
    """ladder.json (every report quotes it; a release carries it in the package): per size, each family's gap
    to Allreduce and its bytes ratio, held out where the held-out seeds have run (else in-sample, and said so)."""
    sizes = []
    for size, vs in found.items():
        ref = next((v for v in vs if v.family == REFERENCE), None)
        rows = []
        for v in vs:
            if v.family == REFERENCE:
                continue
            n = min(len(v.in_sample), len(ref.in_sample)) if ref else 0
            held = [s for s in v.seeds if s in v.held and s in v.ref_held]  # held-out seeds both finished
            in_gap = 100 * (statistics.mean(v.in_sample[:n]) / statistics.mean(ref.in_sample[:n]) - 1) if n else None
            ratio = v.ratio() if held else _in_sample_ratio(size, v, out)
            if (in_gap is None and not held) or ratio is None:
                continue
            seeds = held or [CHOOSE_SEED, *IN_SAMPLE][:n]
            said = (f"held-out seed{'s' * (len(held) > 1)} {', '.join(map(str, held))}"
                    + (f" ({len(held)} of {len(v.seeds)})" if len(held) < len(v.seeds) else "") if held
                    else f"in-sample: seed{'s' * (n > 1)} that chose the setting")
            rows.append({"method": v.family, "spec": v.job.spec, "lr": v.job.lr, "fewer_bytes": tenth_down(ratio),
                         "gap_pct": round(v.gap() if held else in_gap, 2), "seeds": said, "seed_list": seeds})
        sizes.append({"size": size, "params": PARAMS[size], "methods": rows})
    with open(SUMMARY, "w") as f:
        json.dump({"commit": commit(), "workload": f"GPT on the whole KJV, {WORKERS} workers, {EPOCHS} epochs, "
                   "the same samples for every method", "sizes": sizes}, f, indent=1)
        f.write("\n")
    print(f"summary for the report: {os.path.relpath(SUMMARY)}")


def _in_sample_ratio(size: str, v: Verdict, out_dir: str) -> float | None:
    """Allreduce's bytes over the family's on the choosing seed."""
    ref = chosen(family_named(REFERENCE), size, out_dir)
    mine, theirs = final(v.job, out_dir), final(ref, out_dir) if ref else None
    if not mine or not theirs or not mine["bytes_sent_per_worker"]:
        return None
    return theirs["bytes_sent_per_worker"] / mine["bytes_sent_per_worker"]


def plan(sizes: list[str], out: str) -> None:
    """The runs known now that are still to do, in the order --run takes them (more appear as runs finish:
    brackets, the families that follow another's rate, the held-out seeds of a choice)."""
    todo: dict[Job, str] = {}  # a run two families share (a seed-0 run) once, at its first stage
    for size, stage, fams in order(sizes):
        for j in stage_jobs(size, stage, out, fams):
            if not done(j, out):
                todo.setdefault(j, stage)
    for j, stage in todo.items():
        print(f"{stage:9} {j.size:6} {j.spec} lr={j.lr:g} seed {j.seed}")
    print(f"{len(todo)} runs known to be still to do; {sum(done(j, out) for j in every_job(sizes, out))} done")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--run", action="store_true", help="run the next jobs until none is left")
    p.add_argument("--plan", action="store_true", help="print the jobs still to run, in order")
    p.add_argument("--report", action="store_true", help="print the tables, write ladder.csv and the figure")
    p.add_argument("--sizes", default="small,tiny,nano", help="comma-separated GPT sizes, in the order to run them")
    p.add_argument("--out", default="runs/ladder", help="parent of the run directories")
    p.add_argument("--figure", default="", help="the figure's PNG (default: ladder.png in --out; with --publish "
                   "benchmarks/figures/ladder.png)")
    p.add_argument("--publish", action="store_true", help="--report writes the committed ladder.csv and "
                   "ladder.json (every report quotes it) and benchmarks/figures/ladder.png; without it they go to --out")
    p.add_argument("--device", default="", help="cpu or cuda: every run there (train.device; default: "
                   "lowband's own choice)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="train.precision of the runs (default auto: a size's committed records' own, else bf16 "
                        "on --device cuda and fp32 on the CPU); a size's runs share one")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (1 on a 2-core CPU)")
    p.add_argument("--families", default="", help="comma-separated families whose runs --run and --plan take "
                   f"(default: all of {', '.join(f.name for f in FAMILIES)}); a family's held-out runs need "
                   "Allreduce's choice made")
    args = p.parse_args()
    if not (args.run or args.plan or args.report):
        p.error("nothing to do: give --run, --plan or --report")
    check_paths(p, args)
    check_device(p, args.device)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad or not sizes:
        p.error(f"--sizes {args.sizes!r}: each must be one of {', '.join(SIZES)}")
    ONLY.update(f.strip() for f in args.families.split(",") if f.strip())
    if unknown := sorted(ONLY - {f.name for f in FAMILIES}):
        p.error(f"--families {args.families!r}: {', '.join(unknown)} is not one of "
                f"{', '.join(f.name for f in FAMILIES)}")
    if not 1 <= args.parallel <= 16:
        p.error(f"--parallel {args.parallel}: must be in 1..16")
    if args.device:
        DEVICE.extend(["--set", f"train.device='{args.device}'"])
    try:
        PRECISION.update({s: precision_for(s, args.precision, args.device) for s in sizes})
    except ValueError as e:
        p.error(str(e))
    signal.signal(signal.SIGTERM, stop_runs)
    publish_to(args.out, args.publish)
    figure = args.figure or (os.path.join(HERE, "figures", "ladder.png") if args.publish
                             else os.path.join(args.out, "ladder.png"))
    try:
        PARAMS.update({s: params_of(s) for s in sizes})
        if args.plan:
            plan(sizes, args.out)
        if args.run:
            run_all(sizes, args.out, args.parallel)
        if args.report or args.run:
            os.makedirs(args.out, exist_ok=True)
            report(sizes, args.out, figure)
    except KeyboardInterrupt:
        stop_runs(signal.SIGINT, None)
        for proc in list(LIVE):
            proc.wait()
        sys.exit("ladder.py: interrupted; a run that was training resumes from its last checkpoint next time")


def check_paths(p: argparse.ArgumentParser, args) -> None:
    """--out a folder that can be made and written, --figure a file that can be written (one line, exit 2)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
    from lowband.errors import UsageError
    from lowband.paths import can_make_dir, writable_file

    try:
        can_make_dir(args.out, "--out")
        if args.figure:
            writable_file(args.figure, "--figure")
    except UsageError as e:
        p.error(str(e))


def check_device(p: argparse.ArgumentParser, device: str) -> None:
    """--device one a run can use here, before any run: a refused one would be refused at every try."""
    if not device:
        return
    if device not in ("cpu", "cuda"):
        p.error(f"--device {device!r}: must be cpu or cuda (train.device)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device 'cuda': no CUDA GPU is visible here")


if __name__ == "__main__":
    main()
