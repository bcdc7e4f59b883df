"""Running the service with its HTTP API: in the foreground (``gate serve``) or in a thread."""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

from gate.serve._api import create_app
from gate.service._service import GateService


class ListenError(OSError):
    """The HTTP address cannot be bound."""


def bind(host: str, port: int) -> socket.socket:
    """Listen before starting anything, so a busy port is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"http: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


GRACEFUL_SHUTDOWN_S = 3
"""Longest wait at shutdown for responses still open (streams and long-polls end at once
when the service begins stopping; this bounds anything else)."""


class GateServer(uvicorn.Server):
    """uvicorn's server that tells the service it is stopping before waiting for open
    responses: its streams and long-polls end at once, so a stop takes about a second
    however many clients are attached."""

    def __init__(self, config: uvicorn.Config, service: GateService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.begin_stopping()
        # One line says the gate stops (``gate serve`` logs it), not uvicorn's five.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        await super().shutdown(sockets)


def make_server(service: GateService, log_level: str = "info") -> GateServer:
    return GateServer(
        uvicorn.Config(
            create_app(service),
            log_level=log_level,
            access_log=log_level == "debug",
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ),
        service,
    )


class ServedGate:
    """A gate service with its HTTP API in a background thread (demo and tests)."""

    def __init__(self, service: GateService, host: str = "127.0.0.1", port: int = 0) -> None:
        service.prepare()
        self.service = service
        self.socket = bind(host, port)
        self._server = make_server(service, "warning")
        self._thread = threading.Thread(target=self._run, daemon=True, name="gate-http")

    def _run(self) -> None:
        self._server.run(sockets=[self.socket])

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self, timeout: float = 20.0) -> ServedGate:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gate's HTTP server did not start")
            time.sleep(0.01)
        return self

    def begin_stopping(self) -> None:
        """Tell clients the gate is stopping, and evaluate no more polls (before stopping
        what the gate watches, so that is not taken for a stall)."""
        self.service.begin_stopping()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        self.socket.close()

    def __enter__(self) -> ServedGate:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
