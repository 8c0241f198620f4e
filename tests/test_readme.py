"""The README's test command is the one CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3")]
    readme = (ROOT / "README.md").read_text()
    assert len(ci) == 1
    assert ci[0] in readme


def test_readme_names_relation_and_delta_for_every_epsilon_table():
    readme = (ROOT / "README.md").read_text()
    assert "add/remove" in readme and "δ" in readme and "upper" in readme
