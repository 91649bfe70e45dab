"""EDL-Dist on this machine: student throughput against N-training and Online KD, accuracy, and
throughput as (slow) teachers are added, the shapes of the paper's Table 1, Table 3 and Fig. 3.

    python benchmarks/edl.py [--epochs 10] [--acc-epochs 30] [--seeds 0,1,2] [--channels 160]

1. Trains a teacher: cnn1d with --channels per convolution on MNIST-1D (one process), and prints
   what its forward pass costs against one training step of the student (cnn1d, 25 channels).
2. Throughput, one student rank pinned to core 0 and one teacher process pinned to core 1 (with
   the Coordinator, `lowband coordinator`), as on two machines; side by side, interleaved:
   `lowband distill --mode ntrain`, `--mode online` (both on core 0), and `--coordinator URL`.
3. Accuracy of EDL-Dist vs N-training, --acc-epochs epochs, over --seeds.
4. Teachers 1 -> 3, each capped at 40% of the student's N-training throughput (emulating
   smaller devices; capped teachers sleep, so three fit on this machine's second core).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def lowband(*args: str, core: int | None = None) -> None:
    done = subprocess.run(pinned(core) + [sys.executable, "-m", "lowband", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"lowband {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def pinned(core: int | None) -> list[str]:
    return ["taskset", "-c", str(core)] if core is not None and os.cpu_count() > 1 else []


@contextlib.contextmanager
def services(*commands: list[str], core: int = 1, ready: str = ""):
    """Background `lowband` processes on `core`; yields the first line of the first one's output."""
    procs = [subprocess.Popen(pinned(core) + [sys.executable, "-m", "lowband", *c], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for c in commands]
    try:
        lines = [p.stdout.readline() for p in procs]  # each prints one line once it serves
        yield lines[0]
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def teachers(url: str, teacher: str, n: int, cap: float = 0.0):
    cmd = ["teacher", "--checkpoint", teacher, "--coordinator", url, "--max-rate", f"{cap:.0f}"]
    return services(*[cmd] * n)


def records(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def epoch_rates(run: str) -> list[float]:
    """Samples/s of each epoch after the first (start-up and prefetch warm-up)."""
    rates = [r["samples_per_s"] for r in records(run)]
    return rates[1:] if len(rates) > 1 else rates


def costs(channels: int, batch: int, group: int = 1) -> tuple[float, float]:
    """ms of one student training step and of one teacher forward pass over `group` batches, one thread."""
    from lowband.config import ModelConfig
    from lowband.models import build_model

    torch.set_num_threads(1)
    x, y = torch.randn(batch, 1, 40), torch.randint(0, 10, (batch,))
    xg = torch.randn(batch * group, 1, 40)
    student = build_model(ModelConfig(name="cnn1d"), (1, 40), 10)
    teacher = build_model(ModelConfig(name="cnn1d", channels=channels), (1, 40), 10).eval()
    opt = torch.optim.SGD(student.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(student(x), y).backward()
        opt.step()

    def timed(fn, n=300):
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e3

    with torch.no_grad():
        fwd = timed(lambda: teacher(xg)) / group
    return timed(step), fwd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--acc-epochs", type=int, default=30)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--channels", type=int, default=160)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of the throughput runs")
    p.add_argument("--parts", default="throughput,accuracy", help="which tables: throughput (with the teacher "
                   "scaling), accuracy")
    a = p.parse_args()
    out = tempfile.mkdtemp(prefix="lowband-edl-")
    for group in (1, 4):  # a request to a teacher carries method.request_batches = 4 minibatches
        step_ms, fwd_ms = costs(a.channels, a.batch, group)
        print(f"student cnn1d training step {step_ms:.2f} ms, teacher cnn1d-{a.channels} forward {fwd_ms:.2f} ms "
              f"per {a.batch} samples in batches of {a.batch * group} (ratio {fwd_ms / step_ms:.2f}), one thread each")
    teacher = os.path.join(out, "teacher")
    lowband("train", "--method", "single", "--set", f"model.channels={a.channels}", "--epochs", "15",
            "--run-dir", teacher)
    print(f"teacher test accuracy {records(teacher)[-1]['test_acc']:.4f}")
    common = ["--teacher", teacher, "--workers", "1", "--batch-size", str(a.batch)]

    def distill(name: str, epochs: int, *extra: str) -> str:
        run = os.path.join(out, name)
        lowband("distill", *common, "--epochs", str(epochs), "--run-dir", run, *extra, core=0)
        return run

    with services(["coordinator"]) as line:
        url = line.split(" at ")[1].split()[0]
        if "throughput" in a.parts:
            throughput_table(a, distill, url, teacher)
        if "accuracy" in a.parts:
            accuracy_table(a, distill, url, teacher)
    print(f"\nruns kept in {out}")


def throughput_table(a, distill, url: str, teacher: str) -> None:
    remote = ["--coordinator", url]
    modes = [("ntrain", ["--mode", "ntrain"]), ("online", ["--mode", "online"]), ("edl", remote)]
    seen = {name: [] for name, _ in modes}
    with teachers(url, teacher, 1):
        for r in range(a.repeats):  # interleaved, so that the machine's drift hits every mode alike
            for name, extra in modes:
                seen[name] += epoch_rates(distill(f"{name}-{r}", a.epochs, *extra))
    rates = {name: statistics.median(v) for name, v in seen.items()}
    print(f"\nthroughput, samples/s (median over {a.repeats} interleaved runs x epochs 2..{a.epochs}):")
    for name, rate in rates.items():
        print(f"  {name:<8} {rate:8.0f}   {rate / rates['ntrain']:.2f}x N-training   {rate / rates['online']:.2f}x Online")
    cap = 0.4 * rates["ntrain"]
    scaled = {n: [] for n in (1, 2, 3)}
    for r in range(a.repeats):
        for n in scaled:
            with teachers(url, teacher, n, cap):
                scaled[n] += epoch_rates(distill(f"teachers-{n}-{r}", a.epochs, *remote, "--set", f"method.teachers={n}"))
    print(f"\nteachers capped at {cap:.0f} samples/s each (40% of N-training), all on core 1 "
          f"(median over {a.repeats} interleaved runs):")
    for n, seen_n in scaled.items():
        rate = statistics.median(seen_n)
        print(f"  {n} teacher(s): {rate:8.0f} samples/s  {rate / rates['ntrain']:.2f}x N-training")


def accuracy_table(a, distill, url: str, teacher: str) -> None:
    print(f"\naccuracy after {a.acc_epochs} epochs (seeds {a.seeds}):")
    with teachers(url, teacher, 1):
        for name, extra in [("ntrain", ["--mode", "ntrain"]), ("edl", ["--coordinator", url])]:
            accs = [records(distill(f"acc-{name}-{s}", a.acc_epochs, "--seed", s, *extra))[-1]["test_acc"]
                    for s in a.seeds.split(",")]
            print(f"  {name:<8} {statistics.mean(accs) * 100:.2f}% +- {statistics.pstdev(accs) * 100:.2f}  "
                  f"({', '.join(f'{x * 100:.1f}' for x in accs)})")


if __name__ == "__main__":
    main()
