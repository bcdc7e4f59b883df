"""What happens to a record whose handler failed (retry, dead-letter, skip or hold), and the
errors a handler may raise to steer it.

A record counts as done only when it was processed, dead-lettered with an acknowledged copy,
or skipped by a policy the user chose (``on_exhausted="skip"``). A record that cannot be
retried (a :class:`~sdk.TerminalError`, or its attempts are exhausted) and has nowhere to go
(no dead-letter topic) is **held**: it stays at the head of its shard, is reported, and the
commit never passes it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sdk.engine._shards import Entry


class RetriableError(Exception):
    """Raise to have a record retried without an error-level log line."""


class TerminalError(Exception):
    """Raise when retrying cannot help: the record is dead-lettered (or skipped) at once."""


class DecodeError(TerminalError):
    """The record's key or value could not be deserialized."""


def describe(error: BaseException) -> str:
    """``"Type: text"`` of a failure: what the engine keeps of it once decided (an exception
    kept on a record would keep whatever its traceback's frames held)."""
    try:
        text = str(error)
    except Exception:
        text = "(unprintable)"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


Decision = Literal["retry", "dead_letter", "skip", "hold"]
RETRY: Decision = "retry"
DEAD_LETTER: Decision = "dead_letter"
SKIP: Decision = "skip"
HOLD: Decision = "hold"


@dataclass(frozen=True)
class FailurePolicy:
    max_attempts: int | None = None
    """Attempts before a record is exhausted; None: never."""
    retry_delay: Callable[[int, BaseException], float] = lambda attempt, error: 0.0
    on_exhausted: Literal["dead_letter", "skip"] = "dead_letter"
    dead_letters: bool = True
    """Whether a dead-letter topic is configured."""
    decode_errors_to_dead_letters: bool = False
    """``on_decode_error="dead_letter"``: undecodable records go there whatever
    ``on_exhausted`` says."""

    def decide(self, entry: Entry, error: BaseException, now: float) -> Decision:
        """Count the failed attempt on ``entry`` and decide what happens to it; a retried
        record's ``not_before`` is set to when its next attempt may start."""
        counts = entry.part.counts
        counts.failed += 1
        entry.attempts += 1
        entry.last_error = describe(error)  # (never the exception: see ``describe``)
        if isinstance(error, DecodeError) and self.decode_errors_to_dead_letters:
            return DEAD_LETTER
        exhausted = self.max_attempts is not None and entry.attempts >= self.max_attempts
        if isinstance(error, TerminalError) or exhausted:
            if self.on_exhausted == "skip":
                return SKIP
            return DEAD_LETTER if self.dead_letters else HOLD
        counts.retried += 1
        entry.not_before = now + max(0.0, float(self.retry_delay(entry.attempts, error)))
        return RETRY
