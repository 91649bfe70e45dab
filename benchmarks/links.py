"""Time to accuracy of every method at three link speeds: unlimited, 100 mbit and 10 mbit per worker.

Runs the `quick` suite (or --suite) once per link speed, with real tc-shaped links between
network namespaces when run as root (--link-mode netns), else modelled links. Prints, per link and
method: seconds to reach the target (the unlimited Allreduce run's final accuracy), that time over
Allreduce's on the same link, and over the method's compute-only limit (its own compute seconds up
to that epoch: the same workers processing the same samples with no communication at all).
Goal: at 10 mbit the best method is within 1.2x of the compute-only limit.

Run: sudo python benchmarks/links.py [--suite quick] [--links unlimited,100mbit,10mbit] [--mode netns]
"""

import argparse
import os
import tempfile

from common import run_compare
from lowband.run.metrics import read_metrics


def run_suite(suite: str, link: str, mode: str, out: str, target: float | None) -> list[dict]:
    extra = ["--set", f"train.target_accuracy={target}"] if target else []
    return run_compare(["--suite", suite, "--link", link, "--link-mode", mode, *extra], out)


def to_target(run_dir: str, target: float) -> tuple[float | None, float | None]:
    """(training seconds, compute-only seconds) until the test accuracy first reached `target`."""
    compute = 0.0
    for r in read_metrics(run_dir):
        compute += r.time["compute_s"]
        if r.test_acc is not None and r.test_acc >= target:
            return r.train_s, compute
    return None, None


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--suite", default="quick")
    p.add_argument("--links", default="unlimited,100mbit,10mbit")
    p.add_argument("--mode", default="netns" if os.geteuid() == 0 else "model")
    a = p.parse_args()
    results, target = {}, None
    with tempfile.TemporaryDirectory() as out:
        for link in a.links.split(","):
            rows = run_suite(a.suite, link, a.mode, out, target)
            if target is None:
                ref = next(r for r in rows if r["method"] == "allreduce" and r["status"] == "ok")
                target = float(ref["final_acc"])
            results[link] = [(r, *to_target(r["run_dir"], target)) if r["status"] == "ok" else (r, None, None)
                             for r in rows]
    print(f"suite {a.suite}, links {a.mode}, target {target:.4f} (Allreduce, unlimited link), {os.cpu_count()} cores\n")
    print("| link | method | final acc | sent/worker MB | s to target | / allreduce | / compute-only |")
    print("|---|---|---|---|---|---|---|")
    for link, rows in results.items():
        ref = next((t for r, t, _ in rows if r["method"] == "allreduce"), None)
        for r, secs, compute in rows:
            if secs is None:
                print(f"| {link} | {r['label']} | {r['final_acc'] or '-'} | | never | | |")
                continue
            vs_ref = f"{secs / ref:.2f}" if ref else "-"
            print(f"| {link} | {r['label']} | {float(r['final_acc']):.4f} | "
                  f"{float(r['bytes_sent_per_worker']) / 1e6:.2f} | {secs:.1f} | {vs_ref} | {secs / compute:.2f} |")


if __name__ == "__main__":
    main()
