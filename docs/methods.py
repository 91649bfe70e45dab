"""Writes docs/METHODS.md, the methods' specification, from the code: `python docs/methods.py`.

Each method's section is its file's docstring (which names the paper and states the algorithm, in
our words) and its options with their defaults and help, as `--set method.KEY=VALUE` takes them. The
code stays the one owner: tests/unit/test_docs.py fails when the committed page differs from what
this script writes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import MISSING, fields

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "METHODS.md")

HEAD = """# The methods

Generated from the code by `python docs/methods.py` (`tests/unit/test_docs.py` fails when this page
is stale). A section is the method file's docstring, which names its paper and states its algorithm,
then its options: `--set method.KEY=VALUE` on the command line, `[method]` in a config file. Where a
method is built on another (SparseLoCo on DiLoCo, TopK on gossip), its table lists the options it
inherits too. How to use them: README.md; where they sit in the code: docs/ARCHITECTURE.md.
"""


def options(config) -> list[str]:
    """A Markdown table of a method config's options (its `name` left out)."""
    from lowband.config import bounds_of

    rows, rules = ["| option | default | what it does |", "|---|---|---|"], bounds_of(config)
    for f in fields(config):
        if f.name == "name":
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        allowed = f"; allowed: {rules[f.name].allowed()}" if f.name in rules else ""
        text = (f.metadata.get("help", "") + allowed).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{default!r}` | {text} |")
    return rows if len(rows) > 2 else ["No options."]


def section(name: str, method) -> list[str]:
    doc = (sys.modules[method.__module__].__doc__ or method.__doc__ or "").strip()
    return [f"## {name}", "", doc, "", *options(method.Config), ""]


def page() -> str:
    from lowband.catalog import load_all
    from lowband.registry import METHODS

    load_all()
    lines = [HEAD]
    for name in METHODS.names():
        lines += section(name, METHODS.get(name))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    with open(PAGE, "w") as f:
        f.write(page())
    print(f"wrote {PAGE}")
