"""Benchmarks: each module a command (``python benchmarks/NAME.py``); see docs/performance.md."""
