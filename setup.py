"""A release carries the published study summaries as package data.

`benchmarks/ladder.py --report --publish` and `benchmarks/workers.py --report --publish` write
benchmarks/results/ladder.json and workers.json, and nothing else writes them. Building a wheel copies them
into lowband/comparison/published/, where lowband.comparison.scale finds them in an installed release; in a
checkout it reads benchmarks/results/ itself. Everything else is in pyproject.toml.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PUBLISHED = ("ladder.json", "workers.json")
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithPublished(build_py):
    """build_py, then the published summaries into the built package."""

    def run(self) -> None:
        super().run()
        target = os.path.join(self.build_lib, "lowband", "comparison", "published")
        os.makedirs(target, exist_ok=True)
        for name in PUBLISHED:
            source = os.path.join(HERE, "benchmarks", "results", name)
            if os.path.isfile(source):  # an sdist without them builds a release that quotes no study
                shutil.copyfile(source, os.path.join(target, name))


setup(cmdclass={"build_py": BuildWithPublished})
