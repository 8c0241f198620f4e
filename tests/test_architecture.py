"""The shape of the code, checked from its imports (``docs/architecture.md``).

The import graph is read from the source (``ast``): every ``import`` and ``from ...
import`` of the four packages, the ones inside functions too (a lazy import is still a
dependency), but not those under ``if TYPE_CHECKING:`` (annotations only). An import of
a package's name resolves to the submodule it names when there is one, else to the
package's ``__init__``.

* **No import cycles** among the modules of ``fedfdp``, ``clients``, ``strategies`` and
  ``simulations``.
* **The configuration has one door**: outside the config package, at most the modules of
  :data:`CONFIG_DOORS` name :class:`fedfdp.config.Config` (annotations included); every
  engine, the strategy, the node runtime, the audit, the attack and resume take the run
  plan or its pieces.
* **Layering**: ``fedfdp`` never imports ``flwr``, ``clients``, ``strategies`` or
  ``simulations``; ``clients`` and ``strategies`` never import ``simulations``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedfdp", "clients", "strategies", "simulations")
LIBRARY = ("fedfdp", "clients", "strategies")

#: The library modules that may name ``Config``: the composition root, resolve_mechanism,
#: CorrDP's design, the centralised entry point and the package's re-export.
CONFIG_DOORS = {
    "fedfdp",
    "fedfdp.run_plan",
    "fedfdp.mechanism",
    "fedfdp.corrdp.run",
    "fedfdp.algorithm",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(name: str, *, annotations: bool = False) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name)`` for every import of module ``name`` (relative imports
    resolved; ``annotations``: those under ``if TYPE_CHECKING:`` too)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def walk(node: ast.AST) -> Iterator[tuple[str, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not annotations:
                for other in child.orelse:
                    yield from walk_one(other)
                continue
            yield from walk_one(child)

    def walk_one(child: ast.AST) -> Iterator[tuple[str, str | None]]:
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name, None
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                prefix = package[: len(package) - (child.level - 1)]
                base = ".".join([*prefix, *([base] if base else [])])
            for alias in child.names:
                yield base, alias.name
        yield from walk(child)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")))


def target(base: str, name: str | None) -> str | None:
    """The project module an import resolves to (None: outside the project)."""
    if name is not None and f"{base}.{name}" in MODULES:
        return f"{base}.{name}"
    parts = base.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) if parts else None


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for base, name in imports(m):
            t = target(base, name)
            if t is not None and t != m:
                edges[m].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_a_cycle_and_ignores_annotations():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # an import under TYPE_CHECKING is no dependency; a lazy one is
    assert ("fedfdp.run_plan", "RunPlan") in set(imports("fedfdp.run_loop", annotations=True))
    assert "fedfdp.run_plan" not in graph()["fedfdp.run_loop"]
    assert "fedfdp.algorithm" in graph()["fedfdp.attack.runs"]  # imported inside functions


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_event_vocabulary_imports_nothing_above_it():
    """The events import only the number checks and the discrete Gaussian's bounds, which
    import nothing of the project but the checks; the checks import nothing of it."""
    edges = graph()
    bounds = "fedfdp.accounting.discrete_gaussian_bounds"
    assert edges["fedfdp.accounting.events"] == {"fedfdp.validate", bounds}
    assert edges[bounds] == {"fedfdp.validate"}
    assert edges["fedfdp.validate"] == set()


def config_importers() -> set[str]:
    return {
        m for m in MODULES
        if m.split(".")[0] in LIBRARY and not m.startswith("fedfdp.config")
        and any(name == "Config" and base.startswith("fedfdp") for base, name in imports(m, annotations=True))
    }


def test_the_configuration_enters_through_one_door():
    doors = config_importers()
    assert doors <= CONFIG_DOORS, sorted(doors - CONFIG_DOORS)
    assert len(CONFIG_DOORS) <= 6


@pytest.mark.parametrize("package", LIBRARY)
def test_layering(package):
    forbidden = {"fedfdp": ("flwr", "clients", "strategies", "simulations"),
                 "clients": ("simulations",), "strategies": ("simulations",)}[package]
    bad = sorted(
        (m, base) for m in MODULES if m.split(".")[0] == package
        for base, _ in imports(m, annotations=True) if base.split(".")[0] in forbidden
    )
    assert bad == []
