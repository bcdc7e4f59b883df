"""Records a handler hands back (:class:`Output`); the engine's producer that writes them is
:class:`~sdk.produce._producer.Outputs`.

A handler returns ``None``, one ``Output`` or an iterable of them; workers produce them as
soon as the handler returns, in the order of their inputs (so per shard in input order, per
key or per partition), and for a batch handler in its order.

Two commit modes decide when an input with outputs counts as done:

- ``CONSUMER`` (at least once): when the broker acknowledged every one of its outputs. A
  worker does not wait for them: the consumer's thread keeps the item's results aside until
  every report is in (:mod:`sdk.produce._deliveries`); a delivery failure fails the input (and holds
  back the rest of its shard in the item), exactly like a handler failure.
- ``TRANSACTIONAL`` (exactly once): at once, because its outputs are in the open transaction,
  which commits together with the inputs' offsets (:mod:`sdk.consumer._transactions`). A worker
  holds the :class:`~sdk.produce._deliveries.TransactionLock` from the start of its item until its
  results are in the consumer's inbox, so a transaction is closed only between items: every output
  in it belongs to an input whose offset goes into the same transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Headers", "Output", "ProduceError", "outputs_of"]

Headers = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]


class ProduceError(Exception):
    """An output of the record could not be produced (serialisation, an unknown topic, a
    delivery report's error). It fails the input like a handler's exception."""


class _Fields(NamedTuple):
    topic: str
    value: bytes | str | None
    key: bytes | str | None
    headers: Headers | None
    partition: int | None


_PLAIN = frozenset({bytes, str, type(None)})


class Output(_Fields):
    """A record for the engine to produce: return one (or a list) from a handler.

    ``value`` and ``key`` are bytes, str (encoded as UTF-8) or None; ``headers`` a mapping or a
    list of (name, value) pairs; ``partition`` None lets the producer's partitioner choose
    (by key). A wrong type raises ``TypeError`` where it is built (failing the input)."""

    __slots__ = ()

    def __new__(
        cls,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> Output:
        if (
            type(topic) is str
            and topic
            and type(value) in _PLAIN
            and type(key) in _PLAIN
            and headers is None
            and partition is None
        ):  # (the common case, checked by exact types at once)
            return _new_tuple(cls, (topic, value, key, None, None))
        if (type(topic) is not str and not isinstance(topic, str)) or not topic:
            raise TypeError(f"Output.topic must be a non-empty str (got {topic!r})")
        if type(value) not in _PLAIN and not isinstance(value, bytes | str):
            raise TypeError(_not_serialised("value", value))
        if type(key) not in _PLAIN and not isinstance(key, bytes | str):
            raise TypeError(_not_serialised("key", key))
        if partition is not None and (
            type(partition) is not int or partition < 0  # (a bool is not a partition)
        ):
            raise TypeError(f"Output.partition must be None or an int >= 0 ({partition!r})")
        if headers is not None:
            _check_headers(headers)
        return _new_tuple(cls, (topic, value, key, headers, partition))


_new_tuple = tuple.__new__


def _not_serialised(name: str, value: object) -> str:
    return (
        f"Output.{name} must be bytes, str or None (got {type(value).__name__}): serialise it "
        "in the handler"
    )


def _check_headers(headers: Headers) -> None:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for pair in pairs:
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not (pair[1] is None or isinstance(pair[1], bytes | str))
        ):
            raise TypeError(
                f"Output.headers: each header is (str, bytes | str | None), got {pair!r}"
            )


def outputs_of(returned: Any) -> list[Output]:
    """The outputs in a handler's return value: one ``Output`` (a subclass's too), or any
    iterable of them (a list, a tuple, a set, a generator, a ``map``...), taken once and in
    its order. Values that hold no ``Output`` at all are ignored (a handler written before
    outputs existed may return anything); a value holding outputs in a form the engine cannot
    take (mixed with other values, nested, in a mapping, an async generator) is an error,
    raised as ``TypeError`` (the input fails)."""
    kind = type(returned)
    if kind is Output:  # (the common cases first)
        return [returned]
    if kind is list or kind is tuple:
        found = returned
    elif kind in _SCALARS:
        return []
    elif isinstance(returned, Output):
        return [returned]
    elif isinstance(returned, _NOT_OUTPUTS):
        return []
    elif isinstance(returned, Mapping):
        if any(_holds_outputs(value) for value in returned.values()):
            raise TypeError(_WRONG_FORM.format(kind="a mapping"))
        return []
    elif isinstance(returned, Iterable):
        found = list(returned)
    elif isinstance(returned, AsyncIterable):
        raise TypeError(_WRONG_FORM.format(kind="an async iterable"))
    else:
        return []
    if not found:
        return []
    outputs = [value for value in found if isinstance(value, Output)]
    if len(outputs) == len(found):
        return outputs if type(outputs) is list else list(outputs)
    if outputs:
        odd = next(value for value in found if not isinstance(value, Output))
        raise TypeError(
            f"the handler returned outputs mixed with {type(odd).__name__}: return None, an "
            "Output or an iterable of Outputs"
        )
    if any(_holds_outputs(value) for value in found):
        raise TypeError(_WRONG_FORM.format(kind="nested iterables"))
    return []


_NOT_OUTPUTS = (str, bytes, bytearray, memoryview)
_SCALARS = frozenset({int, float, bool, str, bytes})
_WRONG_FORM = (
    "the handler returned outputs in {kind}: return None, an Output or an iterable of Outputs"
)


def _holds_outputs(value: Any) -> bool:
    """Whether a value (not itself an output) holds outputs one level down."""
    if isinstance(value, Output):
        return True
    if isinstance(value, list | tuple | set | frozenset):
        return any(isinstance(inner, Output) for inner in value)
    if isinstance(value, Mapping):
        return any(isinstance(inner, Output) for inner in value.values())
    return False
