"""librdkafka's log lines through one Python logger, readable, de-duplicated and rate limited.

Left alone, librdkafka writes every retry to stderr: an unreachable broker prints the same
"Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)" a few
times a second, burying the one line that matters. Every client of the gate, the SDK and the
Spark source passes a :class:`KafkaLog` as its ``logger``: a line is logged the first time,
repeats of it (the same text, ignoring timings) are counted for ``window`` seconds, and the
next occurrence after that says how often it came, e.g. ``broker 127.0.0.1:1 unreachable:
connection refused (repeated 97 times in 10 s)``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_CONNECT = re.compile(
    r"^(?P<broker>[^ /]+)(?:/[^:]*)?: Connect to \S+ failed: (?P<why>[^(]+?)\s*\(after .*$"
)
_TIMINGS = re.compile(r"\(after \d+ms|\d+ identical error\(s\) suppressed|\d+ms")
MAX_KEYS = 512


class KafkaLog:
    """A ``logger`` for confluent-kafka clients (it calls ``log(level, fmt, *args)``)."""

    def __init__(self, name: str, window: float = 10.0) -> None:
        self.logger = logging.getLogger(name)
        self.window = window
        self._seen: dict[str, list[float]] = {}  # key -> [since, repeats]
        self._lock = threading.Lock()

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if len(args) == 3:
            facility, _client, message = args
            text = readable(str(facility), str(message))
        else:
            text = fmt % args if args else fmt
        key = _TIMINGS.sub("", text)
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.window:
                entry[1] += 1
                return
            repeats = int(entry[1]) if entry is not None else 0
            if len(self._seen) >= MAX_KEYS:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = [now, 0]
        if repeats:
            text += f" (repeated {repeats} times in {self.window:.0f} s)"
        self.logger.log(level, "%s", text)

    # logging.Logger's interface, for code that treats the logger as one.
    def isEnabledFor(self, level: int) -> bool:
        return self.logger.isEnabledFor(level)


def readable(facility: str, message: str) -> str:
    """One librdkafka line in words: no thread names, connection failures named as such."""
    message = _THREAD.sub("", message).strip()
    connect = _CONNECT.match(message)
    if connect:
        return f"broker {connect['broker']} unreachable: {connect['why'].strip().lower()}"
    message = re.sub(r",? ?\d+ identical error\(s\) suppressed", "", message)
    return f"{message} [{facility.lower()}]" if facility else message


def describe_kafka_error(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args:
        error = exc.args[0]
        text = getattr(error, "str", None)
        if callable(text):
            return str(text())
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def timed_out(exc: BaseException) -> bool:
    """Whether a request failed by timing out (librdkafka's error, or no answer in time)."""
    if isinstance(exc, TimeoutError):  # (concurrent.futures.TimeoutError too)
        return True
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() in (
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError.REQUEST_TIMED_OUT,
    )
