"""``gate demo``, added to the ``gate`` command through the entry point group
``gate.commands`` (pyproject.toml): :func:`add` receives the command line's typer app.

What it runs is imported when it runs, so every ``gate`` command stays quick to start.
"""

from __future__ import annotations

import logging
import signal
from typing import Annotated

import typer


def add(app: typer.Typer) -> None:
    """Adds ``demo`` to the ``gate`` command's ``app``."""
    app.command()(demo)


def demo(
    bootstrap: Annotated[
        str | None, typer.Option(help="Use this broker instead of starting a local one.")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Use this Redis instead of starting a local one.")
    ] = None,
    no_redis: Annotated[bool, typer.Option("--no-redis", help="Publish over HTTP only.")] = False,
    port: Annotated[int, typer.Option(help="HTTP port of the gate (another if busy).")] = 8080,
    kafka_port: Annotated[
        int, typer.Option(help="Port of the local broker (another if busy).")
    ] = 9092,
    redis_port: Annotated[
        int, typer.Option(help="Port of the local Redis (another if busy).")
    ] = 6379,
    duration: Annotated[float, typer.Option(min=0, help="Seconds to run (0: until Ctrl-C).")] = 0.0,
    rate: Annotated[float, typer.Option(min=0.1, help="Records produced per second.")] = 50.0,
    live: Annotated[bool, typer.Option(help="Redraw the table continuously.")] = True,
) -> None:
    """Run the whole story locally: broker, Redis, dependency services and the gate."""
    from demo._local import LocalServiceError
    from demo._run import DemoError, DemoOptions, run_demo

    signal.signal(signal.SIGTERM, _graceful)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    options = DemoOptions(
        bootstrap=bootstrap,
        redis_url=redis_url,
        use_redis=not no_redis,
        port=port,
        kafka_port=kafka_port,
        redis_port=redis_port,
        duration=duration,
        rate=rate,
        live=live,
    )
    try:
        code = run_demo(options)
    except (LocalServiceError, DemoError) as exc:
        typer.echo(f"gate: {exc}", err=True)  # one line, as every ``gate`` command fails
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _graceful(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: gracefully
