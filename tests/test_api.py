"""The public API: every name in ``fedfdp.__all__`` exists, has a numpy docstring
with at least one runnable example, and every example runs as written."""

import doctest
import importlib
import subprocess
import sys

import pytest

import fedfdp


@pytest.mark.parametrize("name", fedfdp.__all__)
def test_public_name_has_a_docstring_and_runnable_examples(name):
    obj = getattr(fedfdp, name)
    doc = obj.__doc__ or ""
    assert len(doc.strip().splitlines()) > 2, f"{name}: no docstring"
    tests = [t for t in doctest.DocTestFinder(recurse=False).find(obj, name) if t.examples]
    assert tests, f"{name}: no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.failures == 0, f"{name}: {runner.failures} example(s) failed"


def test_the_api_is_small_and_importing_fedfdp_is_cheap():
    assert 10 <= len(fedfdp.__all__) <= 18
    assert sorted(fedfdp.__all__) == sorted(fedfdp._WHERE)
    # names resolve on first use: importing the package loads neither torch nor Flower
    code = "import sys, fedfdp; print('torch' in sys.modules, 'flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = fedfdp.nope


def test_fedfdp_never_imports_flower():
    for name in fedfdp.__all__:
        getattr(fedfdp, name)
    mods = [m for m in sys.modules if m.startswith("fedfdp")]
    for m in mods:
        src = importlib.import_module(m).__file__ or ""
        if src.endswith(".py"):
            with open(src, encoding="utf-8") as fh:
                text = fh.read()
            assert "\nimport flwr" not in text and "\nfrom flwr" not in text, m
