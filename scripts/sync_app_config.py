"""Rewrite ``[tool.flwr.app.config]`` in pyproject.toml from the config defaults.

Run after adding a configuration key: ``python scripts/sync_app_config.py``.
tests/test_config.py fails while the two differ.
"""

import re
from pathlib import Path

import tomli_w

from fedfdp.config import Config

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main() -> None:
    body = tomli_w.dumps(Config().to_flat())
    text = PYPROJECT.read_text()
    new = re.sub(
        r"(\[tool\.flwr\.app\.config\]\n)(.*?)(\n\[)",
        lambda m: m.group(1) + body + m.group(3),
        text,
        flags=re.S,
    )
    if new == text and body not in text:
        raise SystemExit("pyproject.toml: could not find the [tool.flwr.app.config] table")
    PYPROJECT.write_text(new)


if __name__ == "__main__":
    main()
