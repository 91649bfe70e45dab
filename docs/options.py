"""Writes docs/options.md, every option of a run, from the config schema: `python docs/options.py`.

A table per section of the config (`[train]`, `[data]`, `[model]`, `[optim]`, `[link]`, `[elastic]`): each
field with its default and its help, as `--set SECTION.KEY=VALUE` takes it. The method's own options are
docs/METHODS.md's. The code stays the one owner: tests/unit/test_docs.py fails when the committed page
differs from what this script writes.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import MISSING, fields

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "options.md")

HEAD = """# Every option

Generated from the config schema (`src/lowband/config.py`) by `python docs/options.py`
(`tests/unit/test_docs.py` fails when this page is stale). On the command line an option is
`--set SECTION.KEY=VALUE` (a TOML value: `--set optim.name='adamw'`, `--set link.site_of=[0,0,1,1]`), in a
config file a `[SECTION]` table; `lowband config` prints the resolved values of a run, after every check
`lowband train` makes (a dry run). A bad value is refused before anything starts, in one line naming the
field, the value and what is allowed (exit 2).
Shortcut flags (`--workers`, `--epochs`, `--lr`, `--dataset`, `--model`, ...) set the same fields. The
method's own options (`[method]`) are in [METHODS.md](METHODS.md).
"""


def table(section: str, config) -> list[str]:
    rows = [f"## [{section}]", ""]
    if _own_doc(config):
        rows += [(config.__doc__ or "").strip(), ""]
    rows += ["| option | default | what it does |", "|---|---|---|"]
    from lowband.config import bounds_of

    rules = bounds_of(config)
    for f in fields(config):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        allowed = f"; allowed: {rules[f.name].allowed()}" if f.name in rules else ""
        text = (f.metadata.get("help", "") + allowed).replace("|", "\\|")
        rows.append(f"| `{section}.{f.name}` | `{default!r}` | {text} |")
    return rows + [""]


def _own_doc(config) -> bool:
    """Whether a config class has a docstring of its own (a dataclass without one gets its signature)."""
    return bool(config.__doc__) and not config.__doc__.startswith(config.__name__ + "(")


def page() -> str:
    from lowband.config import Config

    lines = [HEAD]
    for f in fields(Config):
        if f.name == "method":
            continue
        config = f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]
        assert dataclasses.is_dataclass(config), f.name
        lines += table(f.name, type(config))
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    with open(PAGE, "w") as f:
        f.write(page())
    print(f"wrote {PAGE}")
