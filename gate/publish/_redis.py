"""The Redis layout of published watermarks, shared by the gate (writer) and the SDK (reader).

For a gate ``G`` and key prefix ``P`` (default ``gate``):

* hash ``P:G:watermarks``: field ``version`` (integer), ``polled_at`` (ISO 8601), ``gate``,
  and one field per partition ``<topic>:<partition>`` whose value is the watermark or
  ``null`` (nothing released on that partition). Topic names cannot contain ``:``.
* channel ``P:G:updates``: every new snapshot, as the JSON wire format of
  :meth:`gate.Snapshot.to_json`.
* string ``P:G:read``: ``"<began> <ended>"``, when the read of the stored snapshot's offsets
  began and ended (milliseconds since the epoch); for writers only.

The writer replaces the hash and publishes in one Lua script, and only when its version is
higher than the stored one, so a reader never sees a half-written snapshot and an older
snapshot never overwrites a newer one (several gate replicas may write the same hash). A
snapshot whose read began before the stored one's ended (two replicas reading at once: either
may have read the newer offsets) is refused when it would move a watermark back: only a read
that began after the stored one's ended can (a dependency rewound).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gate.evaluate._watermark import (
    Snapshot,
    SnapshotError,
    format_time,
    parse_partition,
    parse_time,
)


def watermarks_key(prefix: str, gate: str) -> str:
    return f"{prefix}:{gate}:watermarks"


def updates_channel(prefix: str, gate: str) -> str:
    return f"{prefix}:{gate}:updates"


def read_key(prefix: str, gate: str) -> str:
    return f"{prefix}:{gate}:read"


# KEYS[1] = hash, KEYS[2] = read; ARGV[1] = version, ARGV[2] = channel, ARGV[3] = message,
# ARGV[4] = "<began> <ended>" of the read or "", ARGV[5..] = fields.
# Returns 1 when written, 0 when the stored version is not older, 2 when refused as a read that
# overlapped the stored one's and would move a watermark back.
PUBLISH_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) >= tonumber(ARGV[1]) then
  return 0
end
local began = tonumber(string.match(ARGV[4], '^(%d+) '))
local stored = redis.call('GET', KEYS[2])
if current and began and stored then
  local ended = tonumber(string.match(stored, ' (%d+)$'))
  if ended and began < ended then
    for i = 5, #ARGV, 2 do
      local name, value = ARGV[i], ARGV[i + 1]
      if string.find(name, ':', 1, true) then
        local held = redis.call('HGET', KEYS[1], name)
        if held and held ~= 'null' and (value == 'null' or tonumber(value) < tonumber(held)) then
          return 2
        end
      end
    end
  end
end
redis.call('DEL', KEYS[1])
for i = 5, #ARGV, 2000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 1999, #ARGV)))
end
if began then
  redis.call('SET', KEYS[2], ARGV[4])
else
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""


def read_span(read: tuple[float, float] | None) -> str:
    """``"<began> <ended>"`` in milliseconds, or "" when unknown."""
    if read is None:
        return ""
    began, ended = read
    return f"{int(began * 1000)} {max(int(began * 1000), int(ended * 1000))}"


def snapshot_fields(snapshot: Snapshot) -> list[str]:
    """Field/value pairs of the hash, flattened."""
    fields = [
        "gate",
        snapshot.gate,
        "version",
        str(snapshot.version),
        "polled_at",
        format_time(snapshot.polled_at),
    ]
    for (topic, partition), watermark in sorted(snapshot.watermarks.items()):
        fields += [f"{topic}:{partition}", "null" if watermark is None else str(watermark)]
    return fields


def snapshot_message(snapshot: Snapshot) -> str:
    return json.dumps(snapshot.to_json(), separators=(",", ":"))


def snapshot_from_hash(fields: Mapping[bytes | str, bytes | str]) -> Snapshot | None:
    """Rebuild a snapshot from the hash; ``None`` when the hash is empty (never published)."""
    if not fields:
        return None
    text = {_text(k): _text(v) for k, v in fields.items()}
    gate = text.pop("gate", "")
    version_text = text.pop("version", "")
    polled_at = parse_time(text.pop("polled_at", None))
    if not gate:
        raise SnapshotError("hash has no 'gate' field")
    if not version_text.isdigit():
        raise SnapshotError(f"hash 'version' {version_text!r} is not an integer")
    watermarks: dict[tuple[str, int], int | None] = {}
    for name, value in text.items():
        topic, sep, partition = name.rpartition(":")
        if not sep or not topic:
            raise SnapshotError(f"hash field {name!r} is not '<topic>:<partition>'")
        if value == "null":
            watermark = None
        elif value.isdigit():
            watermark = int(value)
        else:
            raise SnapshotError(f"hash field {name!r} has watermark {value!r}")
        watermarks[(topic, parse_partition(partition))] = watermark
    return Snapshot(
        gate=gate, version=int(version_text), polled_at=polled_at, watermarks=watermarks
    )


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SnapshotError("hash holds bytes that are not UTF-8") from exc
    return value
