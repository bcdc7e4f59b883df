"""Who fences whom: the ``transactional.id`` a consumer's producer takes, and what a failed
transactional call means.

Two producers with one ``transactional.id`` fence each other: the later one's
``init_transactions`` makes every call of the earlier one fail as fenced. So the id a consumer
takes when none is given is stable across restarts only where a restarted member must fence
its predecessor (static membership), and unique to the process otherwise.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from sdk.consumer._errors import EngineError

log = logging.getLogger("sdk")

_UNNAMED = itertools.count(1)
_FENCED = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
}


class TransactionError(EngineError):
    """The transactional producer failed for good (fenced, or unusable)."""


def transactional_id(group: str, config: Mapping[str, Any]) -> str:
    """The ``transactional.id`` used when none is given. With ``group.instance.id`` (static
    membership) it is ``<group.id>.<group.instance.id>``: stable across restarts, so a
    restarted member fences its predecessor and aborts its open transaction at once.
    Otherwise it is unique to the process (host name, process id and a count of such
    consumers): never ``client.id``, which replicas of a service commonly share, and two
    replicas sharing a ``transactional.id`` would fence each other."""
    member = config.get("group.instance.id")
    if not member:  # (one more per consumer: two members in one process must not fence)
        member = f"{socket.gethostname()}-{os.getpid()}-{next(_UNNAMED)}"
        log.info(
            "exactly-once without group.instance.id: transactional.id %s.%s is this "
            "process's own, so after a crash read_committed readers of the outputs wait for "
            "its open transaction to time out (transaction.timeout.ms); set group.instance.id "
            "for a restarted member to abort it at once",
            group,
            member,
        )
    return f"{group}.{member}"


def kind_of(exc: KafkaException) -> str:
    """What a failed transactional call means: ``fenced`` (another producer took the
    ``transactional.id`` over), ``fatal`` (the producer is unusable), ``abortable``,
    ``retriable`` (including a timeout) or ``other``."""
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return "other"
    if error.code() in _FENCED or (error.fatal() and "fenced" in error.str().lower()):
        return "fenced"
    if error.fatal():
        return "fatal"
    if error.txn_requires_abort():
        return "abortable"
    if error.retriable() or error.code() == KafkaError._TIMED_OUT:
        return "retriable"
    return "other"


FENCED_HINT = (
    " (another process with the same transactional.id, or group.instance.id, has taken over)"
)


def error_text(exc: KafkaException) -> str:
    """A failed call's error, in words."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
