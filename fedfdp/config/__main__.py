"""``python -m fedfdp.config``: print the key reference (``docs/configuration.md``)."""

from fedfdp.config.reference import reference_markdown

print(reference_markdown(), end="")
