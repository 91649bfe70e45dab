"""docs/METHODS.md is what docs/methods.py writes from the code: a method, an option or a docstring
changed without the page fails here (run `python docs/methods.py` to write it again)."""

from __future__ import annotations

import importlib.util
import os

from tests.conftest import ROOT


def generator():
    spec = importlib.util.spec_from_file_location("methods_page", os.path.join(ROOT, "docs", "methods.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_methods_page_is_the_code_s_own_account():
    docs = generator()
    with open(docs.PAGE) as f:
        assert f.read() == docs.page(), "docs/METHODS.md is stale: run `python docs/methods.py`"


def test_every_registered_method_has_a_section_with_its_paper_and_options():
    from lowband.registry import METHODS

    page = generator().page()
    for name in METHODS.names():
        start = page.index(f"\n## {name}\n")
        body = page[start:page.find("\n## ", start + 1)]
        assert "| option | default | what it does |" in body or "No options." in body, name
        assert len(body.splitlines()) > 6, f"{name}: no algorithm stated"
