"""Python's cyclic garbage collector while engines run.

The engine allocates a few small objects per record. Reference counting frees them (they
form no cycles), but at the interpreter's default generation-0 threshold (700 allocations)
the collector runs every few hundred records, walks every record still held each time, and
costs about a third of the consumer thread's time at full speed. While at least one engine
runs, the threshold is raised to ``Options.gc_threshold``; it is put back when the last one
stops, unless someone changed it meanwhile. Process-wide by nature, so it is an option
(``gc_threshold=None`` leaves the collector alone). A collector the application turned off
is left as it is too: a threshold of 0 disables automatic collection (raising it would turn
collection back on), and so does ``gc.disable()``.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None
_set: int | None = None


def raise_threshold(threshold: int | None) -> bool:
    """Raise generation 0's threshold to ``threshold`` (never lower it, never turn a disabled
    collector on); returns whether the caller must call :func:`restore` later."""
    global _users, _saved, _set
    if threshold is None:
        return False
    with _lock:
        if _users == 0:
            current = gc.get_threshold()
            if gc.isenabled() and 0 < current[0] < threshold:
                _saved, _set = current, threshold
                gc.set_threshold(threshold, *current[1:])
            else:
                _saved = _set = None
        _users += 1
    return True


def restore() -> None:
    """One engine stopped: the last one puts the threshold back (if nobody changed it)."""
    global _users, _saved, _set
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _saved is not None and gc.get_threshold()[0] == _set:
            gc.set_threshold(*_saved)
        if _users == 0:
            _saved = _set = None
