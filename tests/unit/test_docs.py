"""docs/METHODS.md and docs/options.md are what docs/methods.py and docs/options.py write from the code: a
method, an option or a docstring changed without its page fails here (run the script to write it again);
the user guide builds with `mkdocs build --strict` (no broken link, no page left out of the navigation)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import fields

import pytest

from tests.conftest import ROOT


def generator(script: str = "methods.py"):
    """docs/`script`, a page's generator, as a module."""
    spec = importlib.util.spec_from_file_location(script[:-3] + "_page", os.path.join(ROOT, "docs", script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["methods.py", "options.py"])
def test_a_generated_page_is_the_code_s_own_account(script):
    docs = generator(script)
    with open(docs.PAGE) as f:
        assert f.read() == docs.page(), f"docs/{os.path.basename(docs.PAGE)} is stale: run `python docs/{script}`"


def test_every_registered_method_has_a_section_with_its_paper_and_options():
    from lowband.registry import METHODS

    page = generator().page()
    for name in METHODS.names():
        start = page.index(f"\n## {name}\n")
        body = page[start:page.find("\n## ", start + 1)]
        assert "| option | default | what it does |" in body or "No options." in body, name
        assert len(body.splitlines()) > 6, f"{name}: no algorithm stated"


def test_the_options_page_names_every_field_of_the_config_schema():
    from lowband.config import DataConfig, ElasticConfig, TrainConfig

    page = generator("options.py").page()
    for config, section in ((TrainConfig, "train"), (DataConfig, "data"), (ElasticConfig, "elastic")):
        for f in fields(config):
            assert f"| `{section}.{f.name}` |" in page, f"{section}.{f.name}"


def test_the_guide_builds_with_mkdocs_strict(tmp_path):
    """`make docs`: every page in the navigation, every link found (mkdocs.yml's validation makes both
    warnings, and --strict makes a warning fail)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "elastic" / "index.html").exists()


def test_no_page_of_the_guide_repeats_another():
    """A paragraph (of three lines or more) appears on one page only: each fact has one home."""
    import glob

    seen: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        with open(path) as f:
            for block in f.read().split("\n\n"):
                if block.count("\n") >= 2 and not block.startswith(("|", "```")):
                    key, page = " ".join(block.split()), os.path.basename(path)
                    assert seen.get(key, page) == page, f"{page} repeats {seen[key]}: {block[:80]}"
                    seen[key] = page


def test_the_readme_reads_in_five_minutes_and_its_links_resolve():
    """README: at most 250 lines, the two quick-start commands, and every relative link a file that exists."""
    import re

    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text
    for target in re.findall(r"\]\(([^)#:]+)\)", text):
        assert os.path.exists(os.path.join(ROOT, target)), target
