"""benchmarks/device_ladder.sh, the ladder's call on a lent GPU machine: it refuses what it cannot run in one
line, exit 2, before it installs or starts anything."""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.unit

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "device_ladder.sh")


@pytest.mark.parametrize("args", [[], ["train"], ["run", "medium"], ["run", "medium", "5"], ["run", "medium", "600"],
                                  ["run", "medium", "ten"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    done = subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("usage:"), done.stderr
    assert not os.listdir(tmp_path)  # nothing started
