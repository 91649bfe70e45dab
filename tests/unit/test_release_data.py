"""A release carries the published study summaries (setup.py): no benchmark writes into the package, and an
installed wheel quotes the same ladder and worker-axis figures as the checkout."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ("ladder.json", "workers.json")


def test_no_study_summary_lives_in_the_package_source():
    assert not list((ROOT / "src").rglob("ladder.json")) and not list((ROOT / "src").rglob("workers.json"))


def test_a_wheel_carries_the_published_summaries_and_its_report_reads_them(tmp_path):
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (tree / "benchmarks" / "results").mkdir(parents=True)
    for name in PUBLISHED:
        shutil.copy(ROOT / "benchmarks" / "results" / name, tree / "benchmarks" / "results" / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("lowband-*.whl"))
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    for name in PUBLISHED:
        carried = installed / "lowband" / "comparison" / "published" / name
        assert carried.read_bytes() == (ROOT / "benchmarks" / "results" / name).read_bytes()
    program = ("import json; from lowband.comparison import scale; "
               "print(json.dumps([scale.__file__, scale.ladder(), scale.pools()]))")
    quoted = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(installed)}, timeout=120)
    assert quoted.returncode == 0, quoted.stderr[-2000:]
    expected = [json.loads((ROOT / "benchmarks" / "results" / n).read_text()) for n in PUBLISHED]
    where, *found = json.loads(quoted.stdout)
    assert Path(where).is_relative_to(installed), where  # the wheel's copy, not the checkout's
    assert found == expected and expected[0] and expected[1]
