"""docs/configuration.md is generated from the key table and committed: it must not drift."""

import subprocess
import sys
import tomllib
from pathlib import Path

from fedfdp.config import GUARANTEE_KEYS, Config, config_keys, key_reference, load_config
from fedfdp.config.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"


def test_the_committed_key_reference_is_the_generated_one():
    assert DOC.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/configuration.md is stale: run `python -m fedfdp.config > docs/configuration.md`"
    )


def test_python_m_fedfdp_config_prints_it():
    out = subprocess.run([sys.executable, "-m", "fedfdp.config"], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout == DOC.read_text(encoding="utf-8")
    assert out.stderr == ""


def test_one_row_per_key_whose_defaults_are_the_default_config():
    rows = key_reference()
    assert [r.key for r in rows] == list(config_keys())
    doc = tomllib.loads("\n".join(f"{r.key} = {r.default}" for r in rows))
    assert load_config(doc) == Config()
    assert {r.key for r in rows if r.guarantee != "no"} == GUARANTEE_KEYS
    text = DOC.read_text(encoding="utf-8")
    for r in rows:  # every key appears in its table row, with its guarantee flag
        line = next(li for li in text.splitlines() if li.startswith(f"| `{r.key}` |"))
        assert f"| {r.guarantee} |" in line
