"""Which engine core runs: compiled with mypyc, or the same modules as pure Python.

The install compiles the core's modules (``CORE``: the shards, partitions, scheduler and
core of the consumer's thread with its parts, and the records the workers build) when it can (see
``setup.py``) and records a digest of the sources it compiled. The compiled core is used only
when every one of its modules was built from the sources next to it: a source edited since
(an editable install), a missing build or ``KAFKA_GATE_PURE_CORE=1`` gives the pure-Python
core, all its modules together (their classes cannot be mixed). Both behave the same and run
the same tests; the compiled one does the consumer's thread's own work about 1.7-2x faster,
and builds a batch's records in a third of the time.

Imported by ``sdk/__init__.py`` before anything else of the package.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

CORE = ("_shards", "_partition", "_scheduler", "_intake", "_results", "_buffer", "_core", "_record")
"""The modules compiled together (``sdk.<name>``)."""

DIGESTS = "compiled-core.json"
"""Written by the build next to the sources: the SHA-256 of each source it compiled."""

PURE_ENV = "KAFKA_GATE_PURE_CORE"

log = logging.getLogger("sdk")


def source_digests(package: Path) -> dict[str, str]:
    """The SHA-256 of each core module's source in ``package``."""
    return {
        name: hashlib.sha256((package / f"{name}.py").read_bytes()).hexdigest() for name in CORE
    }


def why_pure(
    wanted_pure: bool, built: Sequence[str], recorded: dict[str, str], sources: dict[str, str]
) -> str | None:
    """Why the pure core must run (None: the compiled one may). ``built``: the core modules
    with a compiled file; ``recorded``: the digests the build wrote; ``sources``: those of the
    sources now."""
    if wanted_pure:
        return f"{PURE_ENV} is set"
    missing = [name for name in CORE if name not in built]
    if missing:
        return "not compiled" if len(missing) == len(CORE) else f"{', '.join(missing)} not compiled"
    changed = [name for name in CORE if recorded.get(name) != sources[name]]
    if changed:
        return f"{', '.join(changed)} changed since it was compiled (reinstall to rebuild)"
    return None


class _SourceFinder:
    """Finds the core's modules as their ``.py`` sources, compiled files next to them aside."""

    def __init__(self, package: Path) -> None:
        self.package = package

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __package__ or name not in CORE:
            return None
        source = str(self.package / f"{name}.py")
        loader = importlib.machinery.SourceFileLoader(fullname, source)
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


def _choose() -> str | None:
    package = Path(__file__).parent
    built = [
        name
        for name in CORE
        if any((package / f"{name}{suffix}").exists() for suffix in _EXTENSION_SUFFIXES)
    ]
    try:
        recorded = json.loads((package / DIGESTS).read_text())
    except (OSError, ValueError):
        recorded = {}
    reason = why_pure(
        bool(os.environ.get(PURE_ENV)), built, recorded, source_digests(package) if built else {}
    )
    if reason is not None:
        sys.meta_path.insert(0, _SourceFinder(package))
        if built and not os.environ.get(PURE_ENV):
            log.warning("the engine's compiled core is not used: %s", reason)
    return reason


_EXTENSION_SUFFIXES = importlib.machinery.EXTENSION_SUFFIXES
PURE_REASON = _choose()
"""Why the pure-Python core runs, or None when the compiled one does."""
COMPILED = PURE_REASON is None
