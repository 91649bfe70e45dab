"""Where the test suite's time goes (issue 68): per layer and per file, from the durations a run wrote.

    LOWBAND_DURATIONS=/tmp/durations.json make test      # or bash .ci/run; any pytest run of tests/
    python benchmarks/suite_time.py /tmp/durations.json [--files 25]

The figures are test seconds (setup, call and teardown summed), not wall time: `make test` runs them on two
workers, so its wall time is about half their sum plus collection and the slowest file's tail. Beside them,
the CPU seconds the test's process and the processes it waited for used (files written from 68's second
stop on): where a file's CPU is far below its test seconds, it mostly waits (heartbeats, timeouts, sleeps).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def layer_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("durations", help="the JSON file LOWBAND_DURATIONS named")
    p.add_argument("--files", type=int, default=25, help="how many of the slowest files to list (1..1000)")
    args = p.parse_args()
    if not 1 <= args.files <= 1000:
        p.error(f"--files={args.files}: must be in [1, 1000]")
    wall, cpu = read(args.durations)
    by_layer, by_file, count = defaultdict(float), defaultdict(float), defaultdict(int)
    cpu_layer, cpu_file = defaultdict(float), defaultdict(float)
    for nodeid, seconds in wall.items():
        path = nodeid.split("::")[0]
        by_layer[layer_of(nodeid)] += seconds
        by_file[path] += seconds
        cpu_layer[layer_of(nodeid)] += cpu.get(nodeid, 0.0)
        cpu_file[path] += cpu.get(nodeid, 0.0)
        count[path] += 1
    total = sum(wall.values())
    print(f"{len(wall)} tests, {total:.0f} test seconds ({total / 60:.1f} min)"
          + (f", {sum(cpu.values()):.0f} CPU seconds" if cpu else "") + "\n")
    extra = (" CPU seconds |", "---|") if cpu else ("", "")
    print(f"| layer | test seconds | share |{extra[0]}\n|---|---|---|{extra[1]}")
    for layer, seconds in sorted(by_layer.items(), key=lambda kv: -kv[1]):
        print(f"| {layer} | {seconds:.0f} | {100 * seconds / total:.1f}% |" + (f" {cpu_layer[layer]:.0f} |" if cpu else ""))
    print(f"\n| the {args.files} slowest files | tests | test seconds | share |{extra[0]}\n|---|---|---|---|{extra[1]}")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:args.files]:
        print(f"| `{path}` | {count[path]} | {seconds:.0f} | {100 * seconds / total:.1f}% |"
              + (f" {cpu_file[path]:.0f} |" if cpu else ""))


def read(path: str) -> tuple[dict[str, float], dict[str, float]]:
    """(wall seconds, CPU seconds) by test; a file from before CPU was recorded has no CPU seconds."""
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"suite_time.py: {path}: {e}")
    if isinstance(found, dict) and "wall_s" in found:
        return found["wall_s"], found.get("cpu_s", {})
    return found, {}


if __name__ == "__main__":
    main()
