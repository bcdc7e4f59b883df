"""The error that stops a consumer, below every module that raises it."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The consumer stopped because of an error it cannot recover from."""
