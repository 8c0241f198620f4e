"""Every ``>>>`` example in the project's packages runs as written.

The modules are listed from the source tree (every ``.py`` file under the four
packages whose text contains ``>>>``), so a new example is collected without
editing this file.  Each module is one parametrised case running
``doctest.testmod`` on it; a module whose file mentions ``>>>`` but yields no
example fails too, so an example hidden where doctest cannot see it (a comment,
a private nested function) is noticed rather than silently skipped.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedfdp", "clients", "strategies", "simulations")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_with_examples() -> list[str]:
    """Dotted names of the project's modules whose source contains ``>>>``."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


MODULES = modules_with_examples()


def test_the_listing_finds_the_known_examples():
    # modules named in issue 24 as holding uncollected examples
    for name in ("fedfdp.run_plan", "fedfdp.quantile_clipping", "fedfdp.contribution"):
        assert name in MODULES, name


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, report=False)
    assert result.attempted > 0, f"{name}: '>>>' in the file but doctest found no example"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example(s) failed"
