"""Every Python snippet of README.md and docs/ runs as written, against the demo.

The demo (``gate demo``) runs as its own process, and each snippet as a script of its own,
with the ``export`` line the demo prints (``KAFKA_BOOTSTRAP``, ``GATE_URL``, ``REDIS_URL``) in
its environment, as a reader would paste it. A snippet that keeps running (a consumer) gets
SIGTERM once it has printed what it processed; every snippet must print something, exit 0
and show no traceback. A block fenced as ```` ```python jvm-kafka ```` needs Spark's JVM
Kafka package and is not run here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gate._local import free_port
from tests.support import wait_until

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for i, match in enumerate(FENCE.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{i + 1}", match.group(1)))
    return found


@pytest.fixture(scope="module")
def demo() -> Iterator[dict[str, str]]:
    command = [
        sys.executable, "-u", "-m", "gate.cli", "demo", "--no-live",
        "--port", str(free_port()), "--kafka-port", str(free_port()),
        "--redis-port", str(free_port()),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
    reader.start()
    try:
        export = wait_until(
            lambda: next((line for line in lines if line.startswith("export ")), None),
            timeout=60,
            what="the demo's export line",
        )
        env = dict(pair.split("=", 1) for pair in export.split()[1:])
        wait_until(
            lambda: httpx.get(f"{env['GATE_URL']}/status/service-a").status_code == 200,
            timeout=30,
            what="the demo's gate",
        )
        yield env
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        reader.join(10)
    stderr = process.stderr.read() if process.stderr else ""
    assert code == 0, stderr  # SIGTERM: a graceful stop
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("where", "code"), snippets(), ids=[w for w, _ in snippets()])
def test_the_snippet_runs_as_written(
    demo: dict[str, str], where: str, code: str, tmp_path: Path
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    process = subprocess.Popen(
        [sys.executable, "-u", str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **demo, "PYTHONPATH": str(ROOT)},
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(process.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline and len(out) < 3:
        time.sleep(0.2)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # a consumer: it has shown it works
    try:
        code_ = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(10)
    stderr = process.stderr.read() if process.stderr else ""
    assert code_ == 0, f"{where} exited {code_}:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert out, f"{where} printed nothing"
