"""The servers a benchmark starts as processes of their own (the gate's, as deployed): a
configuration file, the process, and waiting until it answers."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


@contextmanager
def config_file(config: dict[str, Any]) -> Iterator[Path]:
    """``config`` in a file of its own while the block runs (JSON, which YAML reads)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gate.yaml"
        path.write_text(json.dumps(config))
        yield path


def wait_answering(url: str, server: subprocess.Popen[Any], timeout: float) -> None:
    """Until ``url`` answers 200; exits if the benchmark's ``server`` process ended first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit("the benchmark server did not come up")
        time.sleep(0.1)


@contextmanager
def serving(command: list[str], ready_url: str, timeout: float) -> Iterator[subprocess.Popen[Any]]:
    """``command`` running while the block runs, entered once ``ready_url`` answers."""
    server = subprocess.Popen(command)
    try:
        wait_answering(ready_url, server, timeout)
        yield server
    finally:
        server.terminate()
        server.wait(10)
