"""The partitions of ``/status/{gate}`` written as JSON text directly.

At 1,000 groups x 64 partitions the detail lists 64,000 group positions: making a dict of
each and encoding them with :mod:`json` took about 0.35 s of the serving process per state;
writing each position's text from its tuple takes a fraction of it. The text is exactly
what ``json.dumps`` (as the API encodes) makes of :func:`gate.report._report.gate_partitions`'s
answer: ``tests/gate/test_detail_json.py`` checks it byte for byte.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from gate.evaluate._state import SEVERITY, GateState, PartitionState, position_tuples
from gate.evaluate._watermark import format_time
from gate.report._status_bodies import GroupsShown

_STATUS = tuple(json.dumps(status.value) for status in SEVERITY)
_INFINITE = (math.inf, -math.inf)


def _number(value: int | float) -> str:
    """An offset, a count or an age as JSON: ``str`` writes ints and finite floats as
    ``json`` does."""
    if value != value or value in _INFINITE or type(value) is bool:
        return _text(value)
    return str(value)


def _text(value: Any) -> str:
    """``value`` as JSON (as ``json.dumps`` with ``allow_nan=False`` writes it)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float:
        if not math.isfinite(value):
            raise ValueError(f"out of range float values are not JSON compliant: {value!r}")
        return float.__repr__(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def partitions_json(
    state: GateState, now: float, groups: GroupsShown = "all", named: Collection[str] = ()
) -> bytes:
    """``gate_partitions(state, now, groups, named)`` as the API's JSON."""
    names: dict[str, str] = {}  # each group's name as JSON (the same on every partition)
    times: dict[float | None, tuple[str, str]] = {None: ("null", "null")}
    """When a group's commit moved: as JSON, and the time since, at ``now``."""
    written = []
    for part in state.partitions.values():
        positions = position_tuples(part.groups)
        if groups != "all":
            wanted = [*part.holding, *named] if groups == "holding" else named
            positions = {group: positions[group] for group in wanted if group in positions}
        members = []
        for group, (committed, lag, rank, moved_at, seconds, exact) in positions.items():
            name = names.get(group)
            if name is None:
                name = names[group] = json.dumps(group, ensure_ascii=False)
            moved = times.get(moved_at)
            if moved is None:
                assert moved_at is not None
                moved = times[moved_at] = (
                    json.dumps(format_time(moved_at)),
                    _text(round(max(0.0, now - moved_at), 3)),
                )
            members.append(
                f'{name}:{{"committed":{"null" if committed is None else _number(committed)},'
                f'"lag":{"null" if lag is None else _number(lag)},'
                f'"lag_s":{"null" if seconds is None else _number(round(seconds, 3))},'
                f'"lag_s_exact":{"true" if exact is True else _text(exact)},'
                f'"status":{_STATUS[rank]},'
                f'"moved_at":{moved[0]},"unmoved_s":{moved[1]}}}'
            )
        written.append(_partition(part, ",".join(members)))
    return ("[" + ",".join(written) + "]").encode()


def _partition(part: PartitionState, groups: str) -> str:
    waiting_s = None if part.waiting_seconds is None else round(part.waiting_seconds, 3)
    moved = part.watermark_moved_at
    return (
        f'{{"topic":{_text(part.topic)},"partition":{_text(part.partition)},'
        f'"end_offset":{_text(part.end_offset)},"watermark":{_text(part.watermark)},'
        f'"waiting":{_text(part.waiting)},"waiting_s":{_text(waiting_s)},'
        f'"waiting_s_exact":{_text(part.waiting_exact)},'
        f'"watermark_moved_at":{_text(None if moved is None else format_time(moved))},'
        f'"holding":{_text(list(part.holding))},"dependent":{_text(part.dependent)},'
        f'"groups":{{{groups}}}}}'
    )
