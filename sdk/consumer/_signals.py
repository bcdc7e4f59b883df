"""Stopping on signals: the first SIGTERM or Ctrl-C stops gracefully (records in flight finish
and are committed), a second one at once."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger("sdk")


class Stoppable(Protocol):
    """What a signal stops (a :class:`~sdk.ParallelConsumer`)."""

    def stop(self, *, drain: bool = ..., timeout: float = ..., wait: bool = ...) -> None: ...


def stop_on_signals(
    consumer: Stoppable,
    *,
    timeout: float = 30.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """First signal: graceful stop (drain in-flight records for up to ``timeout`` seconds).
    Second signal: stop at once. Call from the main thread."""
    handle = two_stage_stop(consumer, timeout)
    for sig in signals:
        signal.signal(sig, handle)


def stop_while_running(consumer: Stoppable) -> dict[int, Any]:
    """Turn Ctrl-C and SIGTERM into a graceful stop while ``consumer`` runs on the main
    thread, unless someone else handles them; returns the handlers to restore afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    stop = two_stage_stop(consumer, timeout=30.0)
    restore: dict[int, Any] = {}
    for signum, default in defaults.items():
        if signal.getsignal(signum) is default:  # else stop_on_signals, or the app's own
            signal.signal(signum, stop)
            restore[signum] = default
    return restore


def two_stage_stop(consumer: Stoppable, timeout: float) -> Callable[[int, FrameType | None], None]:
    """A signal handler: the first signal stops gracefully, the next one at once."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        log.info(
            "signal %s: %s stop%s",
            signal.Signals(signum).name,
            "graceful" if received == 1 else "immediate",
            " (again to stop at once)" if received == 1 else "",
        )
        consumer.stop(drain=received == 1, timeout=timeout, wait=False)

    return handle
