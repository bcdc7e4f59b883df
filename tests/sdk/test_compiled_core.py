"""The engine's core runs compiled only when it was built from the sources next to it."""

from __future__ import annotations

import ast
import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sdk.engine._compiled as compiled
import sdk.engine._core
from sdk.engine._compiled import CORE, PURE_ENV, why_pure

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk"
DIGESTS = dict.fromkeys(CORE, "d")


def test_the_compiled_core_runs_when_the_install_built_it() -> None:
    if not compiled.COMPILED and not os.environ.get("REQUIRE_COMPILED_CORE"):
        pytest.skip(f"the pure-Python core runs here: {compiled.PURE_REASON}")
    assert compiled.PURE_REASON is None
    assert compiled.COMPILED
    assert sdk.engine._core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_the_build_compiles_exactly_the_modules_the_package_checks() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    built = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CORE"
    )
    assert tuple(built) == CORE


def test_the_pure_core_runs_when_asked_for_or_not_built_or_built_from_other_sources() -> None:
    assert why_pure(True, CORE, DIGESTS, DIGESTS) == f"{PURE_ENV} is set"
    assert why_pure(False, (), {}, {}) == "not compiled"
    assert why_pure(False, CORE[:-2], DIGESTS, DIGESTS) == "_core, _record not compiled"
    assert why_pure(False, CORE, {}, DIGESTS) == (
        "_shards, _partition, _scheduler, _intake, _results, _buffer, _core, _record changed since "
        "it was compiled (reinstall to rebuild)"
    )
    assert why_pure(False, CORE, DIGESTS, {**DIGESTS, "_core": "e"}).startswith("_core changed")
    assert why_pure(False, CORE, DIGESTS, DIGESTS) is None


def _which_core(package_root: Path, pure: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    env.pop(PURE_ENV, None)
    if pure:
        env[PURE_ENV] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sdk.engine._compiled as c, sdk.engine._core as k, sdk.engine._shards as s;"
            "print(c.PURE_REASON); print(k.__file__); print(s.__file__)",
        ],
        cwd=package_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def copy_of_the_package(tmp_path: Path) -> Path:
    if not compiled.COMPILED:
        pytest.skip(f"needs the compiled core: {compiled.PURE_REASON}")
    shutil.copytree(SDK, tmp_path / "sdk", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_core_source_edited_after_the_build_runs_pure_and_says_so(
    copy_of_the_package: Path,
) -> None:
    unchanged = _which_core(copy_of_the_package)
    reason, core, shards = unchanged.stdout.split()
    assert (reason, Path(core).suffix, Path(shards).suffix) == ("None", ".so", ".so")

    with (copy_of_the_package / "sdk" / "engine" / "_core.py").open("a") as source:
        source.write("\n# edited\n")
    edited = _which_core(copy_of_the_package)
    lines = edited.stdout.splitlines()
    assert lines[0] == "_core changed since it was compiled (reinstall to rebuild)"
    assert [Path(f).name for f in lines[1:]] == ["_core.py", "_shards.py"]  # all four pure
    assert "the engine's compiled core is not used: _core changed" in edited.stderr


def test_the_pure_core_runs_when_the_environment_asks_for_it(copy_of_the_package: Path) -> None:
    asked = _which_core(copy_of_the_package, pure=True)
    lines = asked.stdout.splitlines()
    assert lines[0] == f"{PURE_ENV} is set"
    assert [Path(f).name for f in lines[1:]] == ["_core.py", "_shards.py"]
    assert "not used" not in asked.stderr  # asked for: no warning
