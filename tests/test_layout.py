"""The layout's contracts: which module may import which (import-linter, its contracts in
pyproject.toml), no import circles (grimp, the graph import-linter builds), and the SDK's use
of the gate through what ``gate/__init__.py`` exports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

import gate
from sdk.engine import _record

ROOT = Path(__file__).resolve().parent.parent


def gate_imports() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, module, names) of every import of the gate in the SDK's modules."""
    found = []
    for path in sorted((ROOT / "sdk").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "gate" or node.module.startswith("gate."):
                    names = [alias.name for alias in node.names]
                    found.append(
                        (path.relative_to(ROOT).as_posix(), node.lineno, node.module, names)
                    )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "gate" or alias.name.startswith("gate."):
                        found.append(
                            (path.relative_to(ROOT).as_posix(), node.lineno, alias.name, [])
                        )
    return found


def test_the_sdk_imports_only_the_gates_public_names() -> None:
    """The names the SDK imports from ``gate`` are in ``gate.__all__`` (that it imports no
    module inside the gate is a contract in pyproject.toml)."""
    imports = gate_imports()
    assert imports, "the SDK imports nothing from the gate: the scan is broken"
    unexported = [
        f"{file}:{line} imports {name}"
        for file, line, _, names in imports
        for name in names
        if name not in gate.__all__
    ]
    assert not unexported, "not in gate.__all__:\n" + "\n".join(unexported)


def test_the_import_contracts_hold() -> None:
    """pyproject.toml's contracts: the gate below the SDK, the demo above both, the SDK
    through the gate's API, the gate's layers, its pure parts and the engine's core without
    I/O, the consumer's and the Spark source's layers."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert "Contracts:" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[done.stdout.find("Broken contracts") :]


def circles(exclude_type_checking_imports: bool) -> list[set[str]]:
    """The import circles among the project's modules (strongly connected components)."""
    graph = grimp.build_graph(
        "gate",
        "sdk",
        "demo",
        "bench",
        cache_dir=None,
        exclude_type_checking_imports=exclude_type_checking_imports,
    )
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import circle, at run time or among imports made for type checking only."""
    assert circles(exclude_type_checking_imports=True) == []
    assert circles(exclude_type_checking_imports=False) == []


def test_a_record_without_a_timestamp_is_told_as_confluent_kafka_tells_it() -> None:
    """The record's model keeps confluent-kafka's constant without importing the client."""
    assert _record.TIMESTAMP_NOT_AVAILABLE == TIMESTAMP_NOT_AVAILABLE
