"""The house rules, read from the source with ``ast``: in the agent, the coordinator and the
command line no class is over 400 lines and no function over 60 (a class or function is counted
from its first decorator to its last line, docstrings included); no module of sparkpoint
imports, directly or through others, a module that imports it back (at any depth, imports inside
functions and under ``TYPE_CHECKING`` included); every package says what it is in its
docstring."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "sparkpoint"
LIMITED = ("agent", "coordinator", "cli")
MAX_CLASS = 400
MAX_FUNCTION = 60


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def sizes(path: Path) -> Iterator[tuple[str, str, int]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield kind, node.name, (node.end_lineno or node.lineno) - start + 1


@pytest.mark.parametrize("part", LIMITED)
def test_no_class_over_400_lines_and_no_function_over_60(part: str) -> None:
    too_long = [
        f"{path.relative_to(PACKAGE)}:{name} ({kind}, {lines} lines)"
        for _, path in modules()
        if path.relative_to(PACKAGE).parts[0] == part
        for kind, name, lines in sizes(path)
        if lines > (MAX_CLASS if kind == "class" else MAX_FUNCTION)
    ]
    assert too_long == []


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of sparkpoint that module ``name`` imports (a name imported from a package
    counts as its submodule when it is one, else as the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module
            if node.level:
                parents = package.split(".")
                base = ".".join([*parents[: len(parents) - node.level + 1], node.module])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    paths = dict(modules())
    known = set(paths)
    graph = {name: imports(name, path, known) for name, path in paths.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_says_what_it_is() -> None:
    silent = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("__init__.py")
        if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    ]
    assert silent == []
