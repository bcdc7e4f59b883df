"""A peer library's virtualenv: the peers of the benchmarks (pyrallel-consumer, Quix
Streams) pin what this project cannot share, so each runs from a virtualenv of its own, in a
process of its own, with none of this project on its path."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench._report import console


def peer_env() -> dict[str, str]:
    """The environment of a peer's interpreter: none of this project on its path."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def make_venv(venv: Path, package: str, base: str) -> str:
    """A new virtualenv at ``venv`` made with the interpreter ``base``, ``package`` installed
    in it; returns its interpreter. Raises ``RuntimeError`` (the virtualenv removed) when the
    installation fails."""
    console.print(f"setting up {package} in {venv} with {base}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, env=peer_env())
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", package],
        capture_output=True, text=True, env=peer_env(), check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        raise RuntimeError(f"pip install {package} failed: {installed.stderr.strip()[-300:]}")
    return str(python)


class VenvPeer:
    """A peer library run from a virtualenv of its own. ``python`` is None when it cannot be
    set up (or was not asked for); ``note`` then says why. A subclass names the library
    (``label``) and sets its virtualenv up (``_setup``, given ``--peer-python``)."""

    label = ""

    def __init__(self, python: str | None, enabled: bool = True) -> None:
        self.python: str | None = None
        self.note = "" if enabled else f"{self.label} skipped: --no-peer"
        if not enabled:
            return
        try:
            self.python = self._setup(python)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
            self.note = f"{self.label} skipped: {exc}"

    @staticmethod
    def _setup(python: str | None) -> str:
        raise NotImplementedError
