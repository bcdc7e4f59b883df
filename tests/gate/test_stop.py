"""``gate serve`` and ``gate demo`` stop on Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) and on SIGTERM: at once, with at most a line or two, and exit code 0,
even with a status stream and a long-poll attached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from demo._local import free_port
from tests.support import Kafka, interruptible, unique, wait_until

GATE = [sys.executable, "-m", "gate.cli"]
SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"]
)
# About a second is what a stop takes (the poll in progress ends, open streams and long-polls
# end at once). The bound is generous for a loaded 2-core machine; a stop that waits for the
# streams to time out takes 15 s or more.
STOP_BOUND_S = 5.0


class Output:
    """The lines a process writes to a pipe, read as they come."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(
            target=lambda: self.lines.extend(stream),
            daemon=True,  # type: ignore[call-overload]
        )
        self._thread.start()

    def join(self) -> None:
        self._thread.join(10)


class Clients:
    """A status stream and a long-poll attached to a gate, each in a thread."""

    def __init__(self, url: str, gate: str, topic: str) -> None:
        self.events: list[str] = []
        self.long_poll: list[int | str] = []
        self._threads = [
            threading.Thread(target=self._stream, args=(f"{url}/status/{gate}/stream",)),
            threading.Thread(
                target=self._wait,
                args=(f"{url}/ready?gate={gate}&topic={topic}&partition=0&offset=999&wait=60",),
            ),
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()
        wait_until(lambda: "status" in self.events, timeout=30, what="the first status event")
        time.sleep(0.5)  # the long-poll is waiting by now

    def _stream(self, url: str) -> None:
        try:
            with httpx.stream("GET", url, timeout=None) as response:
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        self.events.append(line.removeprefix("event:").strip())
        except httpx.HTTPError as exc:
            self.events.append(f"error: {exc!r}")

    def _wait(self, url: str) -> None:
        try:
            self.long_poll.append(httpx.get(url, timeout=120).status_code)
        except httpx.HTTPError as exc:
            self.long_poll.append(f"error: {exc!r}")

    def join(self) -> None:
        for thread in self._threads:
            thread.join(10)


@contextmanager
def started(command: list[str]) -> Iterator[tuple[subprocess.Popen[str], Output, Output]]:
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches all of it, as in a terminal
        preexec_fn=interruptible,
    )
    out, err = Output(process.stdout), Output(process.stderr)
    try:
        yield process, out, err
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def stop(process: subprocess.Popen[str], signum: int) -> float:
    """Send ``signum`` as a terminal (SIGINT: the whole group) or a service manager would;
    the seconds until the process ended."""
    began = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    process.wait(60)
    return time.monotonic() - began


def printed(lines: list[str]) -> list[str]:
    return [line.rstrip() for line in lines if line.strip()]


@SIGNALS
def test_serve_stops_at_once_with_a_stream_and_a_long_poll_attached(
    tmp_path: Path, kafka: Kafka, signum: int
) -> None:
    topic = kafka.create_topic(1)
    group = unique("CG")
    kafka.commit(group, topic, {0: 4})
    port = free_port()
    path = tmp_path / "gate.yaml"
    path.write_text(
        f'kafka:\n  bootstrap.servers: "{kafka.bootstrap}"\npoll_interval_ms: 100\n'
        f"gates:\n  a:\n    topics: [{topic}]\n    depends_on: [{group}]\n"
        f"http:\n  port: {port}\n"
    )
    url = f"http://127.0.0.1:{port}"
    with started([*GATE, "serve", "--config", str(path)]) as (process, out, err):
        wait_until(
            lambda: _answers(f"{url}/status/a"), timeout=30, what="gate serve's first snapshot"
        )
        clients = Clients(url, "a", topic)
        before = len(err.lines)
        took = stop(process, signum)
        out.join()
        err.join()
        clients.join()
    assert process.returncode == 0
    assert took < STOP_BOUND_S, f"stopping took {took:.1f}s"
    after = printed(err.lines[before:]) + printed(out.lines)
    assert len(after) <= 2 and after[-1].endswith("gate: stopped"), after
    everything = "".join(err.lines)
    assert "Traceback" not in everything and "ERROR" not in everything, everything
    assert clients.events[-1] == "stopping", clients.events  # the page learns it, then the end
    assert clients.long_poll == [425]  # answered, not cut


@SIGNALS
def test_the_demo_stops_at_once_with_a_stream_and_a_long_poll_attached(signum: int) -> None:
    command = [*GATE, "demo", "--no-live", "--port", "0", "--kafka-port", "0", "--redis-port", "0"]
    with started(command) as (process, out, err):
        export = wait_until(
            lambda: next((line for line in out.lines if line.startswith("export ")), None),
            timeout=90,
            what="the demo's export line",
        )
        env = dict(pair.split("=", 1) for pair in export.split()[1:])
        url = env["GATE_URL"]
        wait_until(lambda: _answers(f"{url}/status/service-a"), timeout=60, what="the demo's gate")
        clients = Clients(url, "service-a", "payments")
        time.sleep(2)  # records flow through service-a
        before_out, before_err = len(out.lines), len(err.lines)
        took = stop(process, signum)
        out.join()
        err.join()
        clients.join()
    assert process.returncode == 0, "".join(err.lines)
    # The demo stops its services, its consumer (committing what it processed), its broker
    # and Redis: a few seconds at most, generous for a loaded 2-core machine.
    assert took < 15, f"stopping took {took:.1f}s"
    after = printed(out.lines[before_out:]) + printed(err.lines[before_err:])
    assert len(after) <= 2, after
    assert "service-a processed" in after[-1]
    assert "Traceback" not in "".join(err.lines), "".join(err.lines)
    assert clients.events[-1] == "stopping", clients.events
    assert clients.long_poll == [425]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
