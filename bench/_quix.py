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
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from bench._produce_runs import Finish, Run, Workload, create_topic, read_outputs, thread_cpu
from bench._report import console

PEER = "quixstreams==3.28.1"
SCRIPT = Path(__file__).resolve().parent / "quix_peer.py"


def venv_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kafka-gate" / "quix-venv"


def _env() -> dict[str, str]:
    """The peer's environment: none of this project on its path."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


class QuixPeer:
    """``python`` is None when the peer cannot be set up (or was not asked for); ``note``
    then says why."""

    def __init__(self, python: str | None, enabled: bool = True) -> None:
        self.python: str | None = None
        self.note = "" if enabled else "Quix Streams skipped: --no-peer"
        if not enabled:
            return
        try:
            self.python = self._setup(python)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
            self.note = f"Quix Streams skipped: {exc}"

    @staticmethod
    def _setup(python: str | None) -> str:
        venv = venv_dir()
        venv_python = venv / "bin" / "python"
        if venv_python.exists():
            check = [str(venv_python), "-c", "import quixstreams"]
            if subprocess.run(check, capture_output=True, env=_env(), check=False).returncode == 0:
                return str(venv_python)
            shutil.rmtree(venv, ignore_errors=True)
        base = python or sys.executable
        console.print(f"setting up {PEER} in {venv} with {base}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, env=_env())
        installed = subprocess.run(
            [str(venv_python), "-m", "pip", "install", "-q", PEER],
            capture_output=True, text=True, env=_env(), check=False,
        )  # fmt: skip
        if installed.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(f"pip install {PEER} failed: {installed.stderr.strip()[-300:]}")
        return str(venv_python)

    def run(
        self, bootstrap: str, admin: AdminClient, topic: str, ends: list[int], workload: Workload
    ) -> Run | None:
        """One run, or None when the peer is missing or failed."""
        if self.python is None:
            return None
        output = f"produce-out-{uuid.uuid4().hex[:8]}"
        create_topic(admin, output)
        group = f"quix-{uuid.uuid4().hex[:8]}"
        guarantee = "exactly-once" if workload.transactional else "at-least-once"
        work = "noop" if workload.work is None else "sleep"
        finish = Finish(bootstrap, group, topic, ends, output, workload.transactional)
        with tempfile.TemporaryFile("w+") as errors:
            process = subprocess.Popen(
                [self.python, str(SCRIPT), bootstrap, topic, output, group, guarantee, work],
                stdout=subprocess.PIPE, stderr=errors, text=True, env=_env(),
            )  # fmt: skip
            try:
                assert process.stdout is not None
                if process.stdout.readline().strip() != "started":
                    process.wait(30)
                    errors.seek(0)
                    console.print(f"[yellow]Quix Streams did not start: {errors.read()[-500:]}")
                    return None
                before = sum(thread_cpu(process.pid).values())
                started = time.perf_counter()
                ended = finish.wait(started)
                cpu = sum(thread_cpu(process.pid).values()) - before
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(10)
        records = sum(ends)
        return Run(
            seconds=ended - started,
            first_record=float("nan"),  # (not known outside its process)
            records=records,
            outputs=read_outputs(bootstrap, output, records),
            cpu=cpu,
        )
