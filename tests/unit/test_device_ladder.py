"""benchmarks/device_ladder.sh, the ladder's call on a lent GPU machine: it refuses what it cannot run in one
line, exit 2, before it installs or starts anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


def test_an_unknown_family_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", SCRIPT, "run", "small", "60"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path), "LADDER_FAMILIES": "diloco-0.7,diloco-07"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("LADDER_FAMILIES: 'diloco-07' is not a family of the ladder"), done.stderr
    assert not os.listdir(tmp_path)


def test_the_script_knows_the_ladders_families(monkeypatch):
    """The script's list is ladder.py's (a family added there must be added here)."""
    monkeypatch.syspath_prepend(os.path.dirname(SCRIPT))
    sys.modules.pop("ladder", None)
    import ladder

    with open(SCRIPT) as f:
        listed = re.search(r'^FAMILIES="([^"]+)"', f.read(), re.M).group(1).split()
    assert listed == [family.name for family in ladder.FAMILIES]
