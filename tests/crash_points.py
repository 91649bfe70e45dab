"""Kill `lowband compare` (SIGKILL) at chosen moments, resume it, and compare it with an uninterrupted one.

A kill point is either a moment in time (seconds after the start: most land inside a run) or the N-th
*event* of the comparison process, where it kills itself mid-way:

  mark N      while appending done.jsonl's line (half of it written)
  write N     while writing a whole file atomically (plan.json, tuning.csv, summary.csv, report.md/html,
              calibration.json: the temporary written, not yet renamed)
  plot N      just before a plot's PNG is saved
  run N       between two runs (a run about to start)

The events are counted in the comparison process only (a wrapper patches these functions before
`lowband.cli.main` runs); the workers are real processes and die with it. `kill_points(seed, ...)` picks
them; `try_point` kills, resumes (`compare --resume`, or the same command again when the kill came before
the comparison had a plan) and returns what the resumed comparison left. tests/faults/test_crash_resume.py
runs a few; benchmarks/crash_consistency.py runs many and prints the figures benchmarks/history/JOURNAL.md quotes.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

KINDS = ("mark", "write", "plot", "run")

WRAPPER = r"""
import json, os, signal, sys
kind, nth, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counts = dict.fromkeys(("mark", "write", "plot", "run"), 0)

def event(name, detail=""):
    counts[name] += 1
    if log:
        with open(log, "a") as f:
            f.write(json.dumps([name, counts[name], str(detail)]) + "\n")
    return name == kind and counts[name] == nth

def die():
    os.kill(os.getpid(), signal.SIGKILL)

from lowband import atomic
from lowband.comparison import folder, runner
from lowband.training import session
import matplotlib.figure

write_atomic = atomic.write_atomic
def patched_write(path, write):
    def half(tmp):
        write(tmp)
        if event("write", os.path.basename(path)):
            die()
    write_atomic(path, half)
atomic.write_atomic = patched_write
for module in ("lowband.comparison.runner", "lowband.run.rundir", "lowband.comparison.calibrate"):
    __import__(module)
    if getattr(sys.modules[module], "write_atomic", None) is write_atomic:
        sys.modules[module].write_atomic = patched_write

mark = folder.ComparisonDir.mark
def patched_mark(self, key, run_dir, code):
    if event("mark", key):
        self.repair_done()
        line = json.dumps({"key": key, "run_dir": run_dir, "code": code}) + "\n"
        with open(self.file(self.DONE), "a") as f:
            f.write(line[:len(line) // 2])
        die()
    mark(self, key, run_dir, code)
folder.ComparisonDir.mark = patched_mark

savefig = matplotlib.figure.Figure.savefig
def patched_savefig(self, path, *a, **kw):
    if event("plot", os.path.basename(str(path))):
        die()
    return savefig(self, path, *a, **kw)
matplotlib.figure.Figure.savefig = patched_savefig

start = session.start
def patched_start(cfg, run_dir, *a, **kw):
    if event("run", os.path.basename(str(run_dir))):
        die()
    return start(cfg, run_dir, *a, **kw)
session.start = patched_start

from lowband.cli import main
sys.exit(main(sys.argv[4:]))
"""

# columns of the console table that depend on the clock, not on the training
TIMED = ("train s", "seconds to target", "speed-up vs allreduce", "dedicated s to target")
# summary.csv columns that a deterministic run reproduces exactly
FIGURES = ("label", "method", "seed", "workers", "val_acc", "final_acc", "best_val_acc", "epochs", "samples",
           "bytes_sent_per_worker", "status")


@dataclass
class Outcome:
    """What a comparison left: its exit code, stderr, finished runs, deterministic figures and table."""

    code: int
    stderr: str
    finished: list[str] = field(default_factory=list)
    figures: list[tuple] = field(default_factory=list)
    table: list[list[str]] = field(default_factory=list)
    tuning: list[tuple] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # temporaries of a write the kill cut short


def compare_process(args: list[str], kind: str = "", nth: int = 0, log: str = "") -> list[str]:
    """The command that runs `lowband compare ARGS`, killing itself at event `kind` number `nth` (none: '')."""
    return [sys.executable, "-c", WRAPPER, kind, str(nth), log, "compare", *args]


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def events(args: list[str], out: str, timeout: float = 300) -> tuple[Outcome, list[tuple[str, int, str]], float]:
    """An uninterrupted comparison into `out`: its outcome, every event it went through, and its seconds."""
    log = os.path.join(out, "events.jsonl")
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    p = run(compare_process([*args, "--out", out], log=log), timeout)
    seconds = time.monotonic() - t0
    with open(log) as f:
        seen = [tuple(json.loads(line)) for line in f]
    return outcome(out, p), seen, seconds  # type: ignore[return-value]


def kill_points(seed: int, seen: list[tuple[str, int, str]], seconds: float, n: int) -> list[tuple[str, float]]:
    """`n` kill points chosen by `seed`: every third a moment in time within the first 80% of the
    uninterrupted comparison's `seconds` (a comparison may run faster the second time: later moments could
    miss it), the others events, each at most once: first one of each kind and of each file written whole
    (plan.json, tuning.csv, summary.csv, report.md, ...) in an order the seed shuffles, then the rest."""
    rng = random.Random(seed)
    first = list({(e[0], e[2] if e[0] == "write" else ""): e for e in reversed(seen)}.values())
    rng.shuffle(first)
    rest = [e for e in seen if e not in first]
    rng.shuffle(rest)
    events = iter(first + rest)
    points: list[tuple[str, float]] = []
    for i in range(n):
        event = None if i % 3 == 2 else next(events, None)
        points.append(("time", round(rng.uniform(0.5, 0.8 * seconds), 2)) if event is None else (event[0], event[1]))
    return points


def try_point(args: list[str], out: str, point: tuple[str, float], timeout: float = 300) -> tuple[str, Outcome]:
    """Kill a comparison into `out` at `point`, then resume it; (the last event before the kill, '' when it
    was not killed; what the resumed comparison left)."""
    kind, where = point
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "events.jsonl")
    cmd = compare_process([*args, "--out", out], *(("", 0) if kind == "time" else (kind, int(where))), log=log)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = proc.wait(timeout=where if kind == "time" else timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        code = proc.wait()
    killed = code == -signal.SIGKILL
    last = ["start", 0, ""]
    if os.path.exists(log):
        with open(log) as f:
            last = ([json.loads(line) for line in f] or [last])[-1]
    folders = glob.glob(os.path.join(out, "compare-*"))
    if folders and os.path.isfile(os.path.join(folders[0], "plan.json")):
        again = run(compare_process(["--resume", folders[0]]), timeout)
    else:  # killed before the comparison had a plan (the folder holds a cut plan.json.tmp at most): nothing to
        for planless in folders:  # resume, so the user runs the same command again
            shutil.rmtree(planless)
        again = run(compare_process([*args, "--out", out]), timeout)
    return (f"{kind} {where:g}, after {last[0]} {last[1]} ({last[2]})" if killed else ""), outcome(out, again)


def outcome(out: str, p: subprocess.CompletedProcess) -> Outcome:
    """Read back what the comparison in `out` left (see Outcome)."""
    result = Outcome(p.returncode, p.stderr)
    folders = glob.glob(os.path.join(out, "compare-*"))
    if len(folders) != 1:
        return result
    folder = folders[0]
    done = {}
    with open(os.path.join(folder, "done.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            done[record["key"]] = record["code"]
    result.finished = sorted(k for k, c in done.items() if c == 0)
    with open(os.path.join(folder, "summary.csv"), newline="") as f:
        result.figures = [tuple(row[k] for k in FIGURES) for row in csv.DictReader(f)]
    tuning = os.path.join(folder, "tuning.csv")
    if os.path.exists(tuning):
        with open(tuning, newline="") as f:
            result.tuning = [tuple(row.values()) for row in csv.DictReader(f)]
    result.table = table_of(p.stdout)
    result.leftovers = sorted(os.path.relpath(path, folder) for path in glob.glob(os.path.join(folder, "**", "*.tmp-*"),
                                                                                    recursive=True))
    return result


def table_of(stdout: str) -> list[list[str]]:
    """The console table's cells, without the columns that depend on the clock."""
    lines = stdout[stdout.index("method "):].splitlines() if "method " in stdout else []
    if len(lines) < 3:
        return []
    rule = lines[1]
    spans, start = [], 0
    for part in rule.split("  "):
        if part:
            spans.append((start, start + len(part)))
        start += len(part) + 2
    body = []
    for line in lines[2:]:
        if not line.strip():
            break
        body.append(line)
    head = [lines[0][a:b].strip() for a, b in spans]
    keep = [i for i, h in enumerate(head) if h not in TIMED]
    return [[head[i] for i in keep]] + [[line[a:b].strip() for j, (a, b) in enumerate(spans) if j in keep]
                                         for line in body]


def same(reference: Outcome, resumed: Outcome) -> list[str]:
    """What differs between an uninterrupted comparison and a killed-and-resumed one (empty: nothing)."""
    problems = []
    if resumed.code != 0:
        problems.append(f"exit {resumed.code}")
    if "Traceback" in resumed.stderr:
        problems.append("a traceback: " + resumed.stderr[resumed.stderr.index("Traceback"):][:300])
    for name in ("finished", "figures", "tuning", "table", "leftovers"):
        if getattr(resumed, name) != getattr(reference, name):
            problems.append(f"{name}: {getattr(resumed, name)} != {getattr(reference, name)}")
    return problems
