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

Reading a map is bounded and validated before anything is expanded: its base is checked
(ASCII digits, below 2**63) and can be compared with the committed offset first
(:func:`parse_base`), and :func:`read_offset_map` returns completed *ranges* from at most
``MAX_DECODED_BYTES`` of payload, so a small map describing millions of offsets costs no
more than its size.

Nothing here performs I/O.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable

MAX_METADATA_BYTES = 4096
MAX_DECODED_BYTES = 64 * 1024
"""Most payload bytes a map is decoded from, whatever it claims (a compressed map could
otherwise expand into millions of offsets)."""
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


Ranges = list[tuple[int, int]]
"""Completed offsets as sorted, disjoint half-open ranges ``[start, stop)``."""


def parse_base(text: str) -> int:
    """The base of an offset map (its second field), checked before anything is decoded."""
    parts = text.split(":", 3)
    if len(parts) != 4 or parts[0] != PREFIX:
        raise OffsetMapError("not an offset map")
    base_text = parts[1]
    # ASCII digits only: str.isdigit() and int() also accept other scripts' digits.
    if not base_text or len(base_text) > 19 or not base_text.isascii() or not base_text.isdigit():
        raise OffsetMapError("offset map base is not an offset")
    base = int(base_text)
    if base >= 2**63:
        raise OffsetMapError("offset map base is not an offset")
    return base


def read_offset_map(text: str, max_bytes: int = MAX_DECODED_BYTES) -> tuple[int, Ranges, bool]:
    """Decode a map into ``(base, completed ranges above base, truncated)``.

    The work is bounded by ``max_bytes`` of decoded payload whatever the map claims: a map
    whose payload decodes to more is cut there (``truncated``), keeping the completed ranges
    of its beginning. That is safe: offsets the map no longer covers are processed again.
    Raises :class:`OffsetMapError` for anything that is not a well-formed map.
    """
    base = parse_base(text)
    codec, payload_text = text.split(":", 3)[2:]
    if codec not in ("r", "b", "R", "B"):
        raise OffsetMapError(f"unknown offset map codec {codec!r}")
    if len(payload_text) > 4 * max_bytes:
        raise OffsetMapError("offset map payload is too long")
    try:
        payload = base64.b64decode(payload_text.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise OffsetMapError("offset map payload is not base64") from exc
    truncated = False
    if codec in ("R", "B"):
        inflater = zlib.decompressobj()
        try:
            inflated = inflater.decompress(payload, max_bytes)
        except zlib.error as exc:
            raise OffsetMapError("offset map payload does not decompress") from exc
        truncated = bool(inflater.unconsumed_tail)
        if not truncated and not inflater.eof:
            raise OffsetMapError("offset map payload does not decompress")
        payload = inflated
    elif len(payload) > max_bytes:
        payload, truncated = payload[:max_bytes], True
    if codec in ("r", "R"):
        ranges = _runs_to_ranges(base, payload, truncated)
    else:
        ranges = _bits_to_ranges(base, payload)
    return base, ranges, truncated


def _runs_to_ranges(base: int, payload: bytes, truncated: bool) -> Ranges:
    ranges: Ranges = []
    offset = base
    try:
        runs = _read_varints(payload)
    except OffsetMapError:
        if not truncated:
            raise
        runs = _read_varints(payload[: _last_varint_end(payload)])
    for i, run in enumerate(runs):
        if i % 2 and run:
            ranges.append((offset, offset + run))
        offset += run
    if ranges and ranges[0][0] == base:  # the base itself is never complete
        first = (base + 1, ranges[0][1])
        ranges[0:1] = [first] if first[0] < first[1] else []
    return ranges


def _last_varint_end(payload: bytes) -> int:
    end = len(payload)
    while end and payload[end - 1] & 0x80:
        end -= 1
    return end


def _bits_to_ranges(base: int, payload: bytes) -> Ranges:
    ranges: Ranges = []
    start: int | None = None
    for index, byte in enumerate(payload):
        if byte == 0xFF and start is not None:
            continue
        if byte == 0 and start is None:
            continue
        for bit in range(8):
            offset = base + index * 8 + bit
            if byte >> bit & 1:
                if start is None:
                    start = offset
            elif start is not None:
                ranges.append((start, offset))
                start = None
    if start is not None:
        ranges.append((start, base + len(payload) * 8))
    if ranges and ranges[0][0] == base:
        first = (base + 1, ranges[0][1])
        ranges[0:1] = [first] if first[0] < first[1] else []
    return ranges


def decode_offset_map(text: str, max_offsets: int = 1_000_000) -> tuple[int, frozenset[int]]:
    """Return ``(base, completed offsets above base)``; raises :class:`OffsetMapError`, also
    when the map would expand to more than ``max_offsets`` offsets or is too large to read."""
    base, ranges, truncated = read_offset_map(text)
    if truncated:
        raise OffsetMapError("offset map is too large to read")
    if sum(stop - start for start, stop in ranges) > max_offsets:
        raise OffsetMapError(f"offset map holds more than {max_offsets} offsets")
    return base, frozenset(o for start, stop in ranges for o in range(start, stop))
