"""Builds the engine's core (``sdk.engine._compiled.CORE``) with mypyc when it can.

Without mypyc or a C compiler, or with ``KAFKA_GATE_PURE_CORE=1``, the package installs as
pure Python and runs the same core uncompiled (``sdk/engine/_compiled.py`` chooses at import).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup

CORE = ("_shards", "_partition", "_scheduler", "_intake", "_results", "_buffer", "_core", "_record")
CORE_PACKAGE = Path(__file__).parent / "sdk" / "engine"
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
"""The commands that build extensions (the metadata steps need none: compiling takes a while)."""


def compiled_core() -> list:
    if not BUILDS.intersection(sys.argv[1:]):
        return []
    # What an earlier build left in the sources (an editable install) goes first: a build that
    # fails or is skipped must leave no compiled module of other sources behind.
    digests = CORE_PACKAGE / "compiled-core.json"
    digests.unlink(missing_ok=True)
    for name in (*CORE, "_native__mypyc"):
        for stale in CORE_PACKAGE.glob(f"{name}.*.so"):
            stale.unlink()
    if os.environ.get("KAFKA_GATE_PURE_CORE"):
        return []
    try:
        from mypyc.build import mypycify

        extensions = mypycify(
            ["--ignore-missing-imports", "--follow-imports=silent"]
            + [f"sdk/engine/{name}.py" for name in CORE],
            group_name="sdk.engine._native",
        )
    except (Exception, SystemExit) as exc:  # mypyc absent, or it refused (type errors)
        print(f"kafka-gate: installing the pure-Python engine core ({exc!r})", file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # a failed C build leaves the pure-Python core
    digests.write_text(
        json.dumps(
            {
                name: hashlib.sha256((CORE_PACKAGE / f"{name}.py").read_bytes()).hexdigest()
                for name in CORE
            }
        )
    )
    return extensions


setup(ext_modules=compiled_core())
