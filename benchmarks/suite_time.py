"""Where the test suite's time goes (issue 68): per layer and per file, from the durations a run wrote.

    LOWBAND_DURATIONS=/tmp/durations.json make test      # or bash .ci/run; any pytest run of tests/
    python benchmarks/suite_time.py /tmp/durations.json [--files 25]

The figures are test seconds (setup, call and teardown summed), not wall time: `make test` runs them on two
workers, so its wall time is about half their sum plus collection and the slowest file's tail.
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
    try:
        with open(args.durations) as f:
            durations: dict[str, float] = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"suite_time.py: {args.durations}: {e}")
    by_layer, by_file, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for nodeid, seconds in durations.items():
        path = nodeid.split("::")[0]
        by_layer[layer_of(nodeid)] += seconds
        by_file[path] += seconds
        count[path] += 1
    total = sum(durations.values())
    print(f"{len(durations)} tests, {total:.0f} test seconds ({total / 60:.1f} min)\n")
    print("| layer | test seconds | share |\n|---|---|---|")
    for layer, seconds in sorted(by_layer.items(), key=lambda kv: -kv[1]):
        print(f"| {layer} | {seconds:.0f} | {100 * seconds / total:.1f}% |")
    print(f"\n| the {args.files} slowest files | tests | test seconds | share |\n|---|---|---|---|")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:args.files]:
        print(f"| `{path}` | {count[path]} | {seconds:.0f} | {100 * seconds / total:.1f}% |")


if __name__ == "__main__":
    main()
