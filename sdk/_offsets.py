"""Offset maps: which records beyond the committed offset are already completed.

The committed offset of a partition only covers the contiguous prefix of completed records.
Records completed beyond it (out of order, in KEY or UNORDERED mode) are encoded in the
commit's metadata so that a restart skips them instead of processing them again.

Format: ``om1:<base>:<codec>:<payload>`` where ``base`` is the committed offset the map belongs
to, ``payload`` is URL-safe base64 and ``codec`` is one of

* ``r``: run lengths (varints), alternating incomplete/complete, starting at ``base``;
* ``b``: a bitset, bit ``i`` set when ``base + i`` is completed;
* ``R`` / ``B``: the same, zlib-compressed.

The smallest encoding wins. A map that does not fit the broker's metadata limit (4096 bytes by
default) cannot be stored (:func:`encode_offset_map` returns ``None``).

Nothing here performs I/O.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable

MAX_METADATA_BYTES = 4096
PREFIX = "om1"


class OffsetMapError(ValueError):
    """Commit metadata that is not an offset map this version can read."""


def _varints(values: Iterable[int]) -> bytes:
    out = bytearray()
    for value in values:
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                break
    return bytes(out)


def _read_varints(data: bytes) -> list[int]:
    values, value, shift = [], 0, 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise OffsetMapError("run length too long")
        else:
            values.append(value)
            value, shift = 0, 0
    if shift:
        raise OffsetMapError("truncated run length")
    return values


def _run_lengths(base: int, completed: list[int]) -> bytes:
    runs: list[int] = []
    expected = base  # next offset not yet described
    for offset in completed:
        if offset == expected and runs and len(runs) % 2 == 0:
            runs[-1] += 1  # extends the current run of completed offsets
        else:
            runs.append(offset - expected)  # incomplete gap before this one
            runs.append(1)
        expected = offset + 1
    return _varints(runs)


def _bitset(base: int, completed: list[int]) -> bytes:
    bits = bytearray((completed[-1] - base) // 8 + 1)
    for offset in completed:
        i = offset - base
        bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def encode_offset_map(
    base: int, completed: Iterable[int], limit: int = MAX_METADATA_BYTES
) -> str | None:
    """Encode the completed offsets above ``base`` (the committed offset, itself incomplete).

    Returns ``""`` when there is nothing to record and ``None`` when the map does not fit in
    ``limit`` bytes.
    """
    offsets = sorted(o for o in set(completed) if o > base)
    if not offsets:
        return ""
    candidates = []
    for codec, payload in (("r", _run_lengths(base, offsets)), ("b", _bitset(base, offsets))):
        candidates.append((codec, payload))
        if len(payload) > 32:
            packed = zlib.compress(payload, 9)
            if len(packed) < len(payload):
                candidates.append((codec.upper(), packed))
    codec, payload = min(candidates, key=lambda c: len(c[1]))
    text = f"{PREFIX}:{base}:{codec}:{base64.urlsafe_b64encode(payload).decode('ascii')}"
    return text if len(text.encode("ascii")) <= limit else None


def decode_offset_map(text: str) -> tuple[int, frozenset[int]]:
    """Return ``(base, completed offsets above base)``; raises :class:`OffsetMapError`."""
    parts = text.split(":")
    if len(parts) != 4 or parts[0] != PREFIX:
        raise OffsetMapError("not an offset map")
    _, base_text, codec, payload_text = parts
    if not base_text.isdigit():
        raise OffsetMapError("offset map base is not an offset")
    base = int(base_text)
    try:
        payload = base64.b64decode(payload_text.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise OffsetMapError("offset map payload is not base64") from exc
    if codec in ("R", "B"):
        try:
            payload = zlib.decompress(payload)
        except zlib.error as exc:
            raise OffsetMapError("offset map payload does not decompress") from exc
        codec = codec.lower()
    completed: set[int] = set()
    if codec == "r":
        offset = base
        for i, run in enumerate(_read_varints(payload)):
            if i % 2:
                completed.update(range(offset, offset + run))
            offset += run
    elif codec == "b":
        for index, byte in enumerate(payload):
            if byte:
                completed.update(base + index * 8 + bit for bit in range(8) if byte >> bit & 1)
    else:
        raise OffsetMapError(f"unknown offset map codec {codec!r}")
    completed.discard(base)
    return base, frozenset(completed)
