"""Quix Streams, the produce benchmark's peer: a virtualenv of its own, one process per run.

Quix Streams pins a confluent-kafka older than this project's, so it cannot share the
benchmark's interpreter: it is installed on first use into a virtualenv under the user's
cache directory (``$XDG_CACHE_HOME/kafka-gate/quix-venv``, else ``~/.cache/...``), and every
run is a process of its own (``bench/quix_peer.py``), timed and measured from here like the
other consumers: from its start until the group's commits (and, exactly once, the outputs)
are in, its CPU time read from ``/proc`` over the same window.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from confluent_kafka.admin import AdminClient

from bench._proc import thread_cpu
from bench._produce_runs import Run, Watched, Workload
from bench._report import console
from bench._venv import VenvPeer, make_venv, peer_env

PEER = "quixstreams==3.28.1"
SCRIPT = Path(__file__).resolve().parent / "quix_peer.py"


def venv_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kafka-gate" / "quix-venv"


class QuixPeer(VenvPeer):
    """Quix Streams, installed on first use (see the module's docstring)."""

    label = "Quix Streams"

    @staticmethod
    def _setup(python: str | None) -> str:
        venv = venv_dir()
        venv_python = venv / "bin" / "python"
        if venv_python.exists():
            check = [str(venv_python), "-c", "import quixstreams"]
            found = subprocess.run(check, capture_output=True, env=peer_env(), check=False)
            if found.returncode == 0:
                return str(venv_python)
            shutil.rmtree(venv, ignore_errors=True)
        return make_venv(venv, PEER, python or sys.executable)

    def run(
        self, bootstrap: str, admin: AdminClient, topic: str, ends: list[int], workload: Workload
    ) -> Run | None:
        """One run, or None when the peer is missing or failed."""
        if self.python is None:
            return None
        watched = Watched(bootstrap, admin, topic, ends, workload, "quix")
        guarantee = "exactly-once" if workload.transactional else "at-least-once"
        work = "noop" if workload.work is None else "sleep"
        command = [self.python, str(SCRIPT), bootstrap, topic, watched.output, watched.group,
                   guarantee, work]  # fmt: skip
        with tempfile.TemporaryFile("w+") as errors:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, text=True, env=peer_env()
            )
            try:
                assert process.stdout is not None
                if process.stdout.readline().strip() != "started":
                    process.wait(30)
                    errors.seek(0)
                    console.print(f"[yellow]Quix Streams did not start: {errors.read()[-500:]}")
                    return None
                before = sum(thread_cpu(process.pid).values())
                watched.start(cpu=False)
                watched.wait()
                cpu = sum(thread_cpu(process.pid).values()) - before
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(10)
        # (when its first record was handled is not known outside its process)
        return watched.run(float("nan"), cpu=cpu)
