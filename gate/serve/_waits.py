"""Responses that wait (long-polls, event streams) end as soon as the service begins to stop,
instead of holding the shutdown until they time out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from gate.service._service import GateService

T = TypeVar("T")


class Stopping(Exception):
    """The service began stopping while a response waited."""


async def unless_stopping(service: GateService, waiting: Awaitable[T]) -> T:
    """What ``waiting`` gives, unless the service begins stopping first (:class:`Stopping`)."""
    work = asyncio.ensure_future(waiting)
    if service.stopping.is_set():
        work.cancel()
        raise Stopping
    stop = asyncio.ensure_future(service.stopping.wait())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, stop):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if work.done() and not work.cancelled():
        return work.result()
    raise Stopping
