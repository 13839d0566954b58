"""The coordinator's core is pure logic: no Kafka, no HTTP, no files, no threads, no event loop,
and nothing of the service or the REST layer wired around it. Every module of
sparkpoint/coordinator/core is read with ast, and so is every sparkpoint module it imports, at
any depth (an import through `sparkpoint.common` counts as much as a direct one): none imports a
forbidden module (anywhere in the file, also inside a function) and none calls ``open``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import sparkpoint

PACKAGE = Path(sparkpoint.__file__).parent
CORE = PACKAGE / "coordinator" / "core"

FORBIDDEN = (
    "confluent_kafka",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "pydantic",
    "fsspec",
    "pyarrow",
    "s3fs",
    "socket",
    "asyncio",
    "threading",
    "sparkpoint.common.kafka",
    "sparkpoint.common.storage",
    "sparkpoint.common.broker",
    "sparkpoint.coordinator.service",
    "sparkpoint.coordinator.rest",
)

OPENERS = {"open", "fdopen"}
"""``open(...)``, ``io.open``, ``os.open``, ``os.fdopen``, ``Path(...).open``..."""


def core_modules() -> list[str]:
    return sorted(f"sparkpoint.coordinator.core.{p.stem}" for p in CORE.glob("*.py"))


def source_of(module: str) -> Path | None:
    """The file of a sparkpoint module (a package's ``__init__.py``); None for a name that is
    no module (``from sparkpoint.x import SomeClass``)."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module name the tree imports, absolute; for ``from x import y`` both ``x`` and
    ``x.y`` (``y`` may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def is_forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def opens(tree: ast.AST) -> list[int]:
    """Lines that call ``open`` (the builtin, or any ``.open``/``.fdopen``)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in OPENERS)
            or (isinstance(node.func, ast.Attribute) and node.func.attr in OPENERS)
        )
    ]


def reached(start: str) -> dict[str, list[str]]:
    """Every sparkpoint module ``start`` imports, at any depth, with the chain that leads there
    (``start`` first)."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        module = todo.pop()
        path = source_of(module)
        assert path is not None, module
        tree = ast.parse(path.read_text(), str(path))
        for name in imports(tree, module, path.name == "__init__.py"):
            if name.startswith("sparkpoint.") and name not in chains and source_of(name):
                chains[name] = [*chains[module], name]
                todo.append(name)
    return chains


def problems(start: str) -> list[str]:
    found = []
    for module, chain in sorted(reached(start).items()):
        path = source_of(module)
        assert path is not None
        tree = ast.parse(path.read_text(), str(path))
        via = " -> ".join(chain)
        package = path.name == "__init__.py"
        found += [
            f"{via} imports {n}"
            for n in sorted(set(imports(tree, module, package)))
            if is_forbidden(n)
        ]
        found += [f"{via} calls open() at line {line}" for line in opens(tree)]
    return found


def test_every_core_module_is_checked() -> None:
    assert {"coordinator", "admission", "store", "pending", "decider"} <= {
        m.rpartition(".")[2] for m in core_modules()
    }


@pytest.mark.parametrize("module", core_modules())
def test_a_core_module_imports_no_kafka_http_files_threads_or_service(module: str) -> None:
    found = problems(module)
    assert not found, "\n".join(found)


def test_the_check_sees_imports_and_opens_wherever_they_are() -> None:
    tree = ast.parse(
        "from __future__ import annotations\n"
        "from . import storage\n"
        "def later():\n"
        "    import threading.local\n"
        "    from confluent_kafka import Producer\n"
        "    return open('x').read() + Path('y').open().read()\n"
    )
    names = set(imports(tree, "sparkpoint.common.paths", False))
    assert {"sparkpoint.common.storage", "threading.local", "confluent_kafka"} <= names
    assert all(is_forbidden(n) for n in ("sparkpoint.common.storage", "threading.local"))
    assert not is_forbidden("sparkpoint.common.storage_helpers")
    assert opens(tree) == [6, 6]
