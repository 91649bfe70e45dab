"""Every built-in method, model and data set, registered: import this before looking names up.

The registries (registry.py) sit at the bottom of the package and import nothing of it; each
implementation registers itself when its package is imported. This module, above them all,
imports those packages.
"""

from __future__ import annotations


def load_all() -> None:
    """Import the packages whose modules fill the registries."""
    import lowband.data  # noqa: F401
    import lowband.methods  # noqa: F401
    import lowband.models  # noqa: F401
