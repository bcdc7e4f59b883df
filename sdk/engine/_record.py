"""What handlers receive: a :class:`Record` for each Kafka record.

Part of the engine's compiled core (see ``sdk.engine._compiled``): a worker builds one record per
record it runs, so building one must cost next to nothing (compiled, building a batch's
records costs about a third of what pure Python does).

What a record returns comes from its message, whatever that message is (a confluent-kafka
``Message``, or an application's own object in its tests), so the fields are typed ``Any``:
compiled code checks declared types at run time, and a narrower type would make the compiled
record raise where the pure one returns the message's value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from sdk.engine._shards import Entry

_UNSET: Any = object()
# confluent_kafka.TIMESTAMP_NOT_AVAILABLE (a message without a timestamp), kept here so that a
# record's model imports no client (tests/test_layout.py checks that the two agree).
TIMESTAMP_NOT_AVAILABLE: Final = 0


@mypyc_attr(allow_interpreted_subclasses=True)
class Record:
    """One Kafka record as a handler sees it.

    ``key`` and ``value`` are deserialized (on first access) when deserializers are
    configured; ``raw_key`` and ``raw_value`` keep the bytes; when a deserializer fails the
    handler gets the bytes and ``decode_error`` says what failed. ``attempt`` counts from 1;
    ``message`` is the underlying confluent-kafka ``Message``. Building a record costs next
    to nothing: fields are read from the message when used, and are exactly what its
    methods return (``topic`` a ``str``, ``partition`` and ``offset`` ``int``, ``raw_key``
    and ``raw_value`` ``bytes`` or None for a confluent-kafka ``Message``); ``headers`` is
    ``[]`` when the message has none, ``timestamp`` in seconds.
    """

    __slots__ = ("_key", "_key_deserializer", "_value", "_value_deserializer", "attempt", "message")

    def __init__(
        self,
        message: Any,
        attempt: Any = 1,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
    ) -> None:
        self.message = message
        self.attempt = attempt
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._key = _UNSET
        self._value = _UNSET

    @property
    def topic(self) -> Any:
        return self.message.topic()

    @property
    def partition(self) -> Any:
        return self.message.partition()

    @property
    def offset(self) -> Any:
        return self.message.offset()

    @property
    def raw_key(self) -> Any:
        return self.message.key()

    @property
    def raw_value(self) -> Any:
        return self.message.value()

    @property
    def headers(self) -> Any:
        return self.message.headers() or []

    @property
    def timestamp(self) -> Any:
        """Seconds since the epoch, or None when the record has no timestamp."""
        kind, stamp = self.message.timestamp()
        return None if kind == TIMESTAMP_NOT_AVAILABLE else stamp / 1000

    @property
    def key(self) -> Any:
        """The deserialized key (the raw bytes when there is no deserializer, or when it
        failed: see ``decode_error``)."""
        if self._key_deserializer is None:
            return self.message.key()
        if self._key is _UNSET:
            self._key = _decode(self.message.key(), self._key_deserializer)
        return self.message.key() if isinstance(self._key, _Failed) else self._key

    @property
    def value(self) -> Any:
        """The deserialized value (the raw bytes when there is no deserializer, or when it
        failed: see ``decode_error``)."""
        if self._value_deserializer is None:
            return self.message.value()
        if self._value is _UNSET:
            self._value = _decode(self.message.value(), self._value_deserializer)
        return self.message.value() if isinstance(self._value, _Failed) else self._value

    @property
    def decode_error(self) -> str | None:
        """What could not be deserialized (``"value: ValueError: ..."``), or None."""
        self.key, self.value  # noqa: B018 - decode both (cached)
        problems = [
            f"{name}: {decoded.reason}"
            for name, decoded in (("key", self._key), ("value", self._value))
            if isinstance(decoded, _Failed)
        ]
        return "; ".join(problems) or None

    def __repr__(self) -> str:
        return f"Record({self.topic}[{self.partition}]@{self.offset}, attempt={self.attempt})"


class _Failed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decode(raw: Any, deserializer: Callable[[bytes], Any] | None) -> Any:
    if deserializer is None or raw is None:
        return raw
    try:
        return deserializer(raw)
    except Exception as exc:
        return _Failed(f"{type(exc).__name__}: {exc}")


def batch_records(
    entries: list[Entry],
    key_deserializer: Callable[[bytes], Any] | None,
    value_deserializer: Callable[[bytes], Any] | None,
) -> list[Record]:
    """The records of a batch's entries, in order (for its handler)."""
    return [
        Record(entry.payload, entry.attempts + 1, key_deserializer, value_deserializer)
        for entry in entries
    ]
