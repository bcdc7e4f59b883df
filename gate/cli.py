"""The ``gate`` command: serve, check, status, and the commands other packages add (the
demo's ``gate demo``) through the entry point group ``gate.commands``.

Exit codes: 0 success, 1 a problem found or the service failed, 2 invalid configuration or
usage. Errors are one readable line each, never a traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from gate.service._config import ConfigError, GateConfig, load_config

app = typer.Typer(
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Kafka dependency gate: release records only after dependency groups committed past them.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("kafka-gate")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        typer.echo(f"gate {found}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Kafka dependency gate: release records only after dependency groups committed past them.

    Exit codes: 0 success, 1 a problem found or the service failed, 2 invalid configuration or
    usage."""


ConfigOption = Annotated[
    Path,
    typer.Option("--config", "-c", envvar="GATE_CONFIG", help="YAML configuration file."),
]
LogLevel = Annotated[
    str,
    typer.Option("--log-level", help="debug, info, warning or error."),
]


def fail(lines: list[str] | str, code: int = 1) -> NoReturn:
    for line in [lines] if isinstance(lines, str) else lines:
        typer.echo(f"gate: {line}", err=True)
    raise typer.Exit(code)


def _config(path: Path) -> GateConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(exc.problems, 2)


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        fail(f"--log-level: unknown level {level!r} (debug, info, warning, error)", 2)
    logging.basicConfig(
        level=numeric,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def serve(config: ConfigOption, log_level: LogLevel = "info") -> None:
    """Run the gate service: poll, publish watermarks over HTTP (and Redis)."""
    from gate.serve._serve import ListenError, bind, make_server
    from gate.service._service import GateService, StartupError

    setup_logging(log_level)
    cfg = _config(config)
    service = GateService(cfg)
    try:
        service.prepare()
    except StartupError as exc:
        fail(str(exc))
    try:
        sock = bind(cfg.http.host, cfg.http.port)
    except ListenError as exc:
        fail(str(exc))
    server = make_server(service, log_level.lower())
    host, port = sock.getsockname()[:2]
    logging.getLogger("gate").info("serving %d gate(s) on http://%s:%d", len(cfg.gates), host, port)
    # uvicorn shuts down gracefully on SIGTERM and SIGINT, then raises the signal again for
    # the handlers it found: these make that a no-op, so a graceful stop exits with 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    server.run(sockets=[sock])
    if not server.started:
        fail("the service did not start; see the log above")
    logging.getLogger("gate").info("stopped")


@app.command()
def check(
    config: ConfigOption,
    offline: Annotated[
        bool, typer.Option("--offline", help="Check the file only, not the cluster.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as errors.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the cluster.")] = 5.0,
) -> None:
    """Validate a configuration and check it against the live cluster."""
    from gate._check import check_live, check_static

    cfg = _config(config)
    problems = check_static(cfg)
    if not offline:
        problems += check_live(cfg, timeout=timeout)
    for problem in problems:
        typer.echo(problem.line(), err=problem.severity == "error")
    errors = [p for p in problems if p.severity == "error" or strict]
    if errors:
        raise typer.Exit(1)
    typer.echo(
        f"ok: {len(cfg.gates)} gate(s), {len(cfg.groups)} dependency group(s), "
        f"{len(cfg.topics)} topic(s)" + (f", {len(problems)} warning(s)" if problems else "")
    )


@app.command()
def status(
    url: Annotated[
        str, typer.Option(envvar="GATE_URL", help="The gate's HTTP address.")
    ] = "http://127.0.0.1:8080",
    gate: Annotated[str | None, typer.Option(help="Only this gate (default: all).")] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="GATE_API_TOKEN", help="API token, when the gate requires one."),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes.")] = 2.0,
    limit: Annotated[int, typer.Option(min=1, help="Partitions shown per gate.")] = 20,
) -> None:
    """Show why services wait: per gate, the groups holding partitions back and by how much."""
    import time

    from rich.console import Console, RenderableType
    from rich.live import Live

    from gate._statusview import StatusClient, StatusError

    _sigterm_as_ctrl_c()
    client = StatusClient(url, token)
    console = Console() if sys.stdout.isatty() else Console(width=200)

    def view() -> RenderableType:
        return client.view(gate, limit)

    try:
        if not watch:
            console.print(view())
            return
        with Live(view(), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                try:
                    live.update(view())
                except StatusError as exc:  # keep watching through a restart of the gate
                    live.update(f"[red]{exc}[/] (retrying every {interval:g} s)")
    except StatusError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        pass


def _graceful(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a command as Ctrl-C does: gracefully


def _sigterm_as_ctrl_c() -> None:
    """SIGTERM stops this command as Ctrl-C does, gracefully (``serve`` leaves both to
    uvicorn, which shuts down gracefully too)."""
    signal.signal(signal.SIGTERM, _graceful)


def _add_commands() -> None:
    """The commands other packages add: each entry point of the group ``gate.commands`` is a
    callable that receives ``app`` and adds its command to it (pyproject.toml registers
    ``demo = "demo._command:add"``). One whose package is not installed (as in the container
    image, which holds the gate alone) adds nothing."""
    for entry in entry_points(group="gate.commands"):
        try:
            add = entry.load()
        except ModuleNotFoundError as exc:
            if exc.name and f"{entry.module}.".startswith(f"{exc.name}."):
                continue
            raise
        add(app)


_add_commands()


def main() -> None:
    _sigterm_as_ctrl_c()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)  # a command cut short (serve, demo and status --watch exit 0 instead)


if __name__ == "__main__":
    main()
