"""The operator's large answers, serialized once per gate state and kept until the next one.

A gate's summary (in ``/status``), its detail (``/status/{gate}``, per choice of groups, and
its stream) and its history (``/status/{gate}/history``, per choice of groups) depend on its
latest state alone: each is built at the first ask after a poll brought a new state, in a
worker thread and one build at a time for the whole service, and the same bytes answer every
ask until the next state. At 1,000 groups x 64 partitions a detail is 9 MB and takes a few
hundred milliseconds of the interpreter that also answers ``/ready``: a client asking it back
to back now costs one build per poll cycle, not one per ask.

What keeps a kept answer true: every age in it is as of its state's poll (``polled_at``, as
the lags in it always were); what depends on the moment of the ask is made at each ask and
put before the kept bytes: the snapshot's age (``age_s``), the verdict once the snapshot is
older than ``stale_after`` (``unknown``: no poll has succeeded since), and the history's
``now``. A poll that fails for a gate leaves its state but changes its errors: they are part
of what an answer is kept for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gate.evaluate._history import GateHistory
from gate.evaluate._state import GateState
from gate.report._detail_json import partitions_json
from gate.report._report import gate_summary, verdict_json
from gate.report._status_bodies import GroupsShown

Choice = tuple[GroupsShown, tuple[str, ...]]
"""Which groups a detail or history lists: ``groups`` and the groups named (in order)."""

KEPT_CHOICES = 16
"""Choices of groups kept per state (beyond, the oldest is dropped): a state's details of
every group, of the groups holding it back, and of those a few pages name."""


def choice(groups: GroupsShown, named: Sequence[str]) -> Choice:
    """The choice of groups a request makes: every group is every group, whatever it names."""
    return ("all", ()) if groups == "all" else (groups, tuple(named))


def dumps(value: Any) -> bytes:
    """JSON as the API sends it (as Starlette's ``JSONResponse`` renders it)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def as_of(state: GateState) -> float:
    """The time a kept answer's ages are computed at: its state's poll."""
    return state.snapshot.polled_at


class _Kept:
    """The answers of one state of a gate, with the poll's errors concerning it."""

    __slots__ = ("details", "errors", "members", "state", "verdict")

    def __init__(self, state: GateState, errors: tuple[str, ...]) -> None:
        summary = gate_summary(state, as_of(state), None, errors)  # (never unknown: see ask)
        del summary["age_s"]
        self.state = state
        self.errors = errors
        self.verdict = dumps(summary.pop("verdict"))
        self.members = dumps(summary)[1:-1]
        """The summary's members but ``age_s`` and ``verdict``, without braces."""
        self.details: dict[Choice, bytes] = {}
        """The partitions of the detail, per choice of groups."""


class Answers:
    """The kept answers of every gate: those of its latest state alone."""

    def __init__(self, stale_after: float | None) -> None:
        self.stale_after = stale_after
        self.building = threading.Lock()
        """Held while a large answer is built (``/metrics`` too): one at a time, in a worker
        thread; asks that arrive meanwhile wait for it and then find it kept."""
        self._kept: dict[str, _Kept] = {}
        self._histories: dict[str, tuple[GateState, dict[Choice, bytes]]] = {}

    # ---- kept answers, served on the event loop -------------------------------------------

    def _found(self, state: GateState, errors: tuple[str, ...]) -> _Kept | None:
        kept = self._kept.get(state.gate)
        if kept is not None and kept.state is state and kept.errors == errors:
            return kept
        return None

    def _fresh(self, state: GateState) -> bool:
        """Whether the verdict kept for ``state`` is still its verdict now."""
        return self.stale_after is None or _age(state) <= self.stale_after

    def summary_kept(self, state: GateState, errors: tuple[str, ...]) -> list[bytes] | None:
        """The summary of ``state`` if it is kept and needs nothing built (None: ask
        :meth:`summary` in a worker thread)."""
        kept = self._found(state, errors)
        if kept is None or not self._fresh(state):
            return None
        return [self._head(kept), kept.members, b"}"]

    def detail_kept(
        self, state: GateState, errors: tuple[str, ...], chosen: Choice
    ) -> list[bytes] | None:
        """The detail of ``state`` if it is kept and needs nothing built (None: ask
        :meth:`detail` in a worker thread)."""
        kept = self._found(state, errors)
        if kept is None or not self._fresh(state):
            return None
        partitions = kept.details.get(chosen)
        if partitions is None:
            return None
        return [self._head(kept), kept.members, b',"partitions":', partitions, b"}"]

    def history_kept(self, state: GateState, chosen: Choice) -> list[bytes] | None:
        """The history up to ``state`` if it is kept (None: ask :meth:`history`)."""
        found = self._histories.get(state.gate)
        if found is None or found[0] is not state or chosen not in found[1]:
            return None
        return [_history_head(state.gate), found[1][chosen]]

    # ---- building, in a worker thread ------------------------------------------------------

    def summary(self, state: GateState, errors: tuple[str, ...]) -> list[bytes]:
        """The summary of ``state``, built if it is not kept."""
        kept = self._keep(state, errors)
        return [self._head(kept), kept.members, b"}"]

    def detail(self, state: GateState, errors: tuple[str, ...], chosen: Choice) -> list[bytes]:
        """The detail of ``state`` with the groups ``chosen``, built if it is not kept."""
        kept = self._keep(state, errors)
        partitions = kept.details.get(chosen)
        if partitions is None:
            with self.building:
                partitions = kept.details.get(chosen)  # (built while this ask waited?)
                if partitions is None:
                    groups, named = chosen
                    partitions = partitions_json(state, as_of(state), groups, named)
                    _bounded(kept.details)[chosen] = partitions
        return [self._head(kept), kept.members, b',"partitions":', partitions, b"}"]

    def history(
        self,
        state: GateState,
        history: GateHistory,
        points: Sequence[dict[str, Any]],
        chosen: Choice,
    ) -> list[bytes]:
        """The history up to ``state`` (its ``points``, taken on the event loop, which
        records them) with the groups ``chosen``, built if it is not kept."""
        with self.building:
            found = self._histories.get(state.gate)
            if found is None or found[0] is not state:
                if found is not None and found[0].version > state.version:
                    found = (state, {})  # (an ask of an older state: kept apart, not kept)
                else:
                    found = self._histories[state.gate] = (state, {})
            body = found[1].get(chosen)
            if body is None:
                groups, named = chosen
                shown: Collection[str] | None = None
                if groups != "all":
                    holding = state.verdict.holding if groups == "holding" else ()
                    shown = dict.fromkeys([*holding, *named])
                body = dumps(history.to_json(shown, points))[1:]
                _bounded(found[1])[chosen] = body
        return [_history_head(state.gate), body]

    def _keep(self, state: GateState, errors: tuple[str, ...]) -> _Kept:
        kept = self._found(state, errors)
        if kept is not None:
            return kept
        with self.building:
            kept = self._found(state, errors)
            if kept is None:
                kept = _Kept(state, errors)
                current = self._kept.get(state.gate)
                if current is None or current.state.version <= state.version:
                    self._kept[state.gate] = kept  # (never over a newer state's)
        return kept

    def _head(self, kept: _Kept) -> bytes:
        """What is made at each ask: the snapshot's age, and the verdict (built now once the
        snapshot is older than ``stale_after``), as the start of the answer's object."""
        state = kept.state
        age = _age(state)
        verdict = kept.verdict
        if self.stale_after is not None and age > self.stale_after:
            verdict = dumps(
                verdict_json(state, as_of(state), self.stale_after, kept.errors, age=age)
            )
        return b'{"age_s":' + dumps(round(age, 3)) + b',"verdict":' + verdict + b","


def _age(state: GateState) -> float:
    """The snapshot's age now: the monotonic time passed since its poll."""
    return state.snapshot.age(state.now(time.monotonic(), time.time()))


def _history_head(gate: str) -> bytes:
    return b'{"gate":' + dumps(gate) + b',"now":' + dumps(time.time()) + b","


def _bounded(kept: dict[Choice, bytes]) -> dict[Choice, bytes]:
    """``kept``, with room for one more choice."""
    while len(kept) >= KEPT_CHOICES:
        del kept[next(iter(kept))]
    return kept


class Pieces(Response):
    """A JSON answer sent as the pieces it is made of: kept bytes are sent as they are, not
    copied into one body."""

    media_type = "application/json"

    def __init__(self, pieces: Sequence[bytes], status_code: int = 200) -> None:
        super().__init__(None, status_code)
        self.pieces = [piece for piece in pieces if piece]
        self.headers["content-length"] = str(sum(map(len, self.pieces)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.pieces) - 1
        for index, piece in enumerate(self.pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": index < last})
        if last < 0:
            await send({"type": "http.response.body", "body": b""})
