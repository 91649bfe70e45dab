"""lowband on a GPU machine, as users run it: one worker, K workers sharing one GPU, CPU against CUDA,
every method of the lm suite, and the lm study's trio at length; samples per second for each.

Checks, in order (each a real `lowband` process; a failure is printed and the script goes on):
  one      allreduce, 1 worker, device auto: the GPU alone (--max-bytes of the KJV, 1 epoch)
  shared   each of --methods with --workers K and no backend option: K workers on one GPU (the backend
           lowband picks), the same text and batch of 16 a worker
  mps      one worker and the same K-worker runs with CUDA MPS started first, when
           nvidia-cuda-mps-control exists (kernels of the K processes then share the GPU instead of taking
           turns)
  agree    a short run (2 workers, gloo, 200 kB, 1 epoch) on the CPU and on CUDA: the validation bits
           per byte of the two, and their difference
  suite    `lowband compare --suite lm --epochs 1` on 300 kB: every method of the lm suite runs on the GPU
           (--suite-methods picks some of them; the suite's teacher is still trained when EDL is picked)
  trio     Allreduce (lr 0.016), DiLoCo (tau 16, outer lr 1.0, lr 0.004) and SparseLoCo (tau 8, 1/64,
           lut2, outer lr 3 and lr 0.016: issue 40's best, stop 49; the H100's run used lr 0.008) on the
           whole KJV for --trio-epochs epochs, side by side (--trio; the lm study's workload: GPT tiny,
           context 64, batch 16, 4 workers)

Prints one line per check and a summary; writes every figure to --json. On one GPU: the first four
checks take about 2 minutes (H200); `suite` about 5 (15 methods at ~20 s each, H100); the trio at 16
epochs about 7 (H100, 407 s beside `suite`).

Run: python benchmarks/gpu_check.py [--checks one,shared,mps,agree,suite] [--workers 8] [--max-bytes 1000000]
         [--methods allreduce,diloco:tau=16:outer_lr=0.7] [--trio] [--json gpu_check.json]
The summary divides each K-worker run's samples a second by one worker's (under MPS: by MPS's one worker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import commit, method_flags

LM = ["--dataset", "text", "--model", "gpt", "--set", "model.size='tiny'", "--set", "data.context=64",
      "--batch-size", "16", "--set", "optim.name='adamw'", "--set", "optim.weight_decay=0.1",
      "--set", "optim.warmup_epochs=0.25", "--set", "optim.lr_scaling='none'"]
TRIO = [("allreduce", "allreduce", 0.016), ("diloco", "diloco:tau=16:outer_lr=1.0", 0.004),
        ("sparseloco", "sparseloco:density=0.015625:codec=lut2:tau=8:outer_lr=3.0", 0.016)]
CHECKS = ("one", "shared", "mps", "agree", "suite")


def lowband(args: list[str], timeout: float = 600) -> tuple[int, float, str]:
    """Run `python -m lowband ARGS`: (exit code, seconds, the last lines of its output)."""
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "lowband", *args], capture_output=True, text=True, timeout=timeout,
                           check=False)
        code, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:
        code, out = 124, f"timed out after {timeout:.0f} s: {e}"
    return code, time.time() - t0, "\n".join(out.strip().splitlines()[-3:])


def last_record(run: str) -> dict:
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except OSError:
        return {}
    return lines[-1] if lines else {}


def banner(run: str) -> str:
    """The run's own line saying its workers, backend and device (from its log)."""
    for name in ("train.log", "log.txt"):
        try:
            with open(os.path.join(run, name)) as f:
                for line in f:
                    if "backend" in line:
                        return line.strip()[:200]
        except OSError:
            continue
    return ""


def train(work: str, name: str, workers: int, extra: list[str], max_bytes: int = 1_000_000,
          epochs: int = 1, spec: str = "allreduce") -> dict:
    """One `lowband train` of the method `spec` on the first `max_bytes` of the KJV; its figures."""
    run = os.path.join(work, name)
    code, secs, tail = lowband(["train", "-q", *method_flags(spec), *LM, "--workers", str(workers),
                                "--epochs", str(epochs), "--set", f"data.max_bytes={max_bytes}",
                                "--set", "optim.lr=0.008", "--run-dir", run, *extra])
    rec = last_record(run)
    out = {"check": name, "method": spec, "exit": code, "wall_s": round(secs, 1), "workers": workers,
           "samples_per_s": rec.get("samples_per_s"), "time": rec.get("time"),
           "val_bpb": rec.get("val_bpb"), "banner": banner(run)}
    if code:
        out["error"] = tail
    return out


def mps_start() -> bool:
    """Start the CUDA MPS daemon when its control program exists; True when it started."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        return False
    return subprocess.run([ctl, "-d"], capture_output=True, check=False).returncode == 0


def mps_stop() -> None:
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl:
        subprocess.run([ctl], input=b"quit\n", capture_output=True, check=False)


def label(prefix: str, k: int, spec: str) -> str:
    """`shared-8` for allreduce, `shared-8-diloco` for another method."""
    method = spec.split(":")[0]
    return f"{prefix}-{k}" + ("" if method == "allreduce" else f"-{method}")


def specs(args) -> list[str]:
    """--methods, one spec each."""
    return [s for s in args.methods.split(",") if s]


def check_one(work: str, args) -> list[dict]:
    return [train(work, "one", 1, [], args.max_bytes, args.epochs)]


def check_shared(work: str, args) -> list[dict]:
    k = args.workers
    return [train(work, label("shared", k, s), k, [], args.max_bytes, args.epochs, s) for s in specs(args)]


def check_mps(work: str, args) -> list[dict]:
    if not mps_start():
        return [{"check": "mps", "exit": None, "note": "no nvidia-cuda-mps-control, or it did not start"}]
    k = args.workers
    try:
        return [train(work, "mps-1", 1, [], args.max_bytes, args.epochs),
                *[train(work, label("mps", k, s), k, [], args.max_bytes, args.epochs, s) for s in specs(args)]]
    finally:
        mps_stop()


def check_agree(work: str, args) -> list[dict]:
    runs = [train(work, f"agree-{d}", 2, ["--set", f"train.device={d}", "--set", "train.backend=gloo"],
                  max_bytes=200_000) for d in ("cpu", "cuda")]
    a, b = (r.get("val_bpb") for r in runs)
    runs.append({"check": "agree", "exit": 0 if a and b else 1, "cpu_bpb": a, "cuda_bpb": b,
                 "difference": None if not (a and b) else round(abs(a - b), 6)})
    return runs


def check_suite(work: str, args) -> list[dict]:
    out = os.path.join(work, "suite")
    code, secs, tail = lowband(["compare", "--suite", "lm", "--epochs", "1", "--set", "data.max_bytes=300000",
                                "--out", out, *(["--methods", args.suite_methods] if args.suite_methods else [])])
    rows = []
    for folder in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        summary = os.path.join(out, folder, "summary.csv")
        if os.path.exists(summary):
            import csv

            with open(summary) as f:
                rows = list(csv.DictReader(f))
    methods = [{"method": r.get("label"), "status": r.get("status"), "val_bpb": r.get("val_bpb"),
                "samples_per_s": r.get("samples_per_s")} for r in rows]
    return [{"check": "suite", "exit": code, "wall_s": round(secs, 1), "methods": methods,
             **({"error": tail} if code else {})}]


def check_trio(work: str, epochs: int) -> list[dict]:
    """The lm study's trio on the whole KJV, side by side, each 4 workers through gloo on the GPU."""
    procs = []
    for name, spec, lr in TRIO:
        run = os.path.join(work, f"trio-{name}")
        args = [sys.executable, "-m", "lowband", "train", "-q", *method_flags(spec), *LM, "--workers", "4",
                "--epochs", str(epochs), "--set", "data.max_bytes=0", "--set", f"optim.lr={lr}",
                "--set", "train.backend=gloo", "--run-dir", run]
        procs.append((name, run, subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    t0, out = time.time(), []
    for name, run, p in procs:
        p.wait()
        rec = last_record(run)
        out.append({"check": f"trio-{name}", "exit": p.returncode, "epochs": epochs, "val_bpb": rec.get("val_bpb"),
                    "bytes_sent_per_worker": rec.get("bytes_sent_per_worker"), "samples_per_s": rec.get("samples_per_s")})
    ref = out[0].get("val_bpb")
    for r in out:
        if ref and r.get("val_bpb"):
            r["vs_allreduce"] = f"{100 * (r['val_bpb'] / ref - 1):+.2f}%"
    out.append({"check": "trio", "wall_s": round(time.time() - t0, 1)})
    return out


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checks", default=",".join(CHECKS), help=f"which of {','.join(CHECKS)} to run")
    p.add_argument("--workers", type=int, default=4, help="K, the workers that share the GPU")
    p.add_argument("--methods", default="allreduce", metavar="SPEC,SPEC",
                   help="shared, mps: the methods K workers run, each `name[:option=value...]` "
                        "(e.g. diloco:tau=16:outer_lr=0.7); one worker is always allreduce")
    p.add_argument("--epochs", type=int, default=1,
                   help="one, shared, mps: epochs each; the last one's samples a second are read (2: the rate "
                        "once every process is warm)")
    p.add_argument("--max-bytes", type=int, default=1_000_000,
                   help="one, shared, mps: the bytes of the KJV they train on for one epoch (0: all of it)")
    p.add_argument("--suite-methods", default="", metavar="M1,M2",
                   help="suite: only these of the lm suite's methods (default: all of them)")
    p.add_argument("--trio", action="store_true", help="also the lm study's trio on the whole KJV")
    p.add_argument("--trio-epochs", type=int, default=16)
    p.add_argument("--json", default="gpu_check.json", help="where every figure is written")
    p.add_argument("--work", default=None, help="where the runs go (default: a temporary folder)")
    args = p.parse_args()
    check_args(p, args)
    import torch

    head = {"gpu": gpu_name(), "torch": torch.__version__, "gpus": torch.cuda.device_count(),
            "cpus": os.cpu_count(), "commit": commit()}
    print(json.dumps(head), flush=True)
    work = args.work or tempfile.mkdtemp(prefix="gpu_check-")
    results: list[dict] = []
    steps = {"one": check_one, "shared": check_shared, "mps": check_mps, "agree": check_agree, "suite": check_suite}
    for name in [c for c in args.checks.split(",") if c]:
        for r in steps[name](work, args):
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.trio:
        for r in check_trio(work, args.trio_epochs):
            print(json.dumps(r), flush=True)
            results.append(r)
    summarize(results)
    with open(args.json, "w") as f:
        json.dump({**head, "results": results}, f, indent=1)
    refused = [r for r in results if r.get("exit") not in (None, 0)]
    if refused:
        print(f"{len(refused)} check(s) failed: {', '.join(str(r.get('check')) for r in refused)} (see {args.json})")
        sys.exit(1)


def check_args(p: argparse.ArgumentParser, args) -> None:
    """Everything a check needs, before any runs: the checks named, the workers bounded, the JSON's folder
    there (so no figure is lost after the runs), the work folder a directory."""
    unknown = [c for c in args.checks.split(",") if c and c not in CHECKS]
    if unknown:
        p.error(f"--checks {args.checks!r}: unknown {', '.join(unknown)}; each of {', '.join(CHECKS)}")
    if not 1 <= args.workers <= 64 or not 1 <= args.trio_epochs <= 1000:
        p.error("--workers must be in [1, 64] and --trio-epochs in [1, 1000]")
    if not 1 <= args.epochs <= 100:
        p.error(f"--epochs {args.epochs}: must be in [1, 100]")
    if not 0 <= args.max_bytes <= 10**9:
        p.error(f"--max-bytes {args.max_bytes}: must be in [0, 1e9] (0: the whole KJV)")
    if not args.methods.strip(",") or any(not s.split(":")[0] for s in args.methods.split(",") if s):
        p.error(f"--methods {args.methods!r}: give method specs like allreduce,diloco:tau=16")
    folder = os.path.dirname(os.path.abspath(args.json))
    if not os.path.isdir(folder) or os.path.isdir(args.json):
        p.error(f"--json {args.json!r}: its folder {folder} must exist, and it must not be a directory")
    if args.work and os.path.exists(args.work) and not os.path.isdir(args.work):
        p.error(f"--work {args.work!r} is a file; give a directory (made if missing)")


def summarize(results: list[dict]) -> None:
    """The ratio of K workers' samples/s to one worker's: under MPS to MPS's one worker, else to `one`."""
    rate = {r["check"]: r.get("samples_per_s") for r in results if r.get("samples_per_s")}
    for name, value in rate.items():
        if name in ("one", "mps-1") or name.startswith(("agree", "trio")):
            continue
        ref = "mps-1" if name.startswith("mps") else "one"
        if rate.get(ref):
            print(f"{name}: {value:,.0f} samples/s, {value / rate[ref]:.2f}x one worker's {rate[ref]:,.0f} ({ref})")


if __name__ == "__main__":
    main()
