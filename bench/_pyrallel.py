"""pyrallel-consumer, the engine benchmark's Python peer: a virtualenv of its own (it needs
Python 3.12 or later), one process per run (``bench/pyrallel_peer.py``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench._report import console
from bench._venv import VenvPeer, make_venv, peer_env

PEER = "pyrallel-consumer==1.0.0"
PEER_VENV = Path(__file__).resolve().parent / ".peer-venv"
PEER_SCRIPT = Path(__file__).resolve().parent / "pyrallel_peer.py"


class Peer(VenvPeer):
    """pyrallel-consumer, the Python peer, in a virtualenv of its own (it needs Python 3.12
    or later). ``python`` is None when it cannot be set up; ``note`` then says why."""

    label = "pyrallel-consumer"

    def __init__(self, python: str | None, enabled: bool = True) -> None:
        super().__init__(python, enabled)
        self.stalls: list[str] = []  # runs that stopped making progress

    @staticmethod
    def _setup(python: str | None) -> str:
        venv_python = PEER_VENV / "bin" / "python"
        if python is None and venv_python.exists():
            return str(venv_python)
        check = "import sys; sys.exit(sys.version_info < (3, 12))"
        candidates = [python] if python else ["python3.13", "python3.12", "python3"]
        base = next(
            (
                found
                for name in candidates
                if (found := shutil.which(name))
                and subprocess.run(
                    [found, "-c", check], check=False, capture_output=True
                ).returncode
                == 0
            ),
            None,
        )
        if base is None:
            tried = ", ".join(candidates)
            raise RuntimeError(f"no Python 3.12 or later among {tried} (pass --peer-python)")
        return make_venv(PEER_VENV, PEER, base)

    def run(
        self,
        bootstrap: str,
        topic: str,
        expected: int,
        ordering: str,
        concurrency: int,
        workload: str,
    ) -> dict[str, Any] | None:
        """One run (see bench/pyrallel_peer.py), or None if the peer is missing or failed."""
        if self.python is None:
            return None
        mode = {"key": "key_hash"}.get(ordering, ordering)
        args = [bootstrap, topic, str(expected), mode, str(concurrency), workload]
        try:
            done = subprocess.run(
                [self.python, str(PEER_SCRIPT), *args],
                check=True, capture_output=True, text=True, timeout=900, env=peer_env(),
            )  # fmt: skip
            outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            if outcome["stalled"]:
                console.print(
                    f"[yellow]pyrallel-consumer stalled on {topic} after {outcome['records']:,} "
                    f"of {expected:,} records (no progress for 30 s)"
                )
                self.stalls.append(f"{topic}: {outcome['records']} of {expected}")
                return None
            return outcome
        except (subprocess.SubprocessError, ValueError, IndexError) as exc:
            stderr = getattr(exc, "stderr", "") or ""
            console.print(f"[yellow]pyrallel-consumer failed on {topic}: {exc} {stderr[-500:]}")
            return None
