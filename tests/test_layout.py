"""The SDK depends on the gate only through what ``gate/__init__.py`` exports."""

from __future__ import annotations

import ast
from pathlib import Path

import gate

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
    imports = gate_imports()
    assert imports, "the SDK imports nothing from the gate: the scan is broken"
    private = [
        f"{file}:{line} imports {module}" for file, line, module, _ in imports if module != "gate"
    ]
    assert not private, "the SDK reaches into the gate's modules:\n" + "\n".join(private)
    unexported = [
        f"{file}:{line} imports {name}"
        for file, line, _, names in imports
        for name in names
        if name not in gate.__all__
    ]
    assert not unexported, "not in gate.__all__:\n" + "\n".join(unexported)
