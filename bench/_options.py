"""The benchmarks' command lines: the parser, and the options several of them share."""

from __future__ import annotations

import argparse

from demo._local import BROKERS, LocalBroker


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose ``--help`` shows the benchmark's docstring as written."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_broker(found: argparse.ArgumentParser, default: str) -> None:
    """``--broker``: which local broker the benchmark starts (tansu or noida)."""
    found.add_argument("--broker", choices=sorted(BROKERS), default=default)


def local_broker(name: str) -> LocalBroker:
    """The local broker ``--broker`` names, to start with ``with``."""
    return BROKERS[name]()


def add_peer(found: argparse.ArgumentParser, name: str, python_help: str) -> None:
    """``--peer-python`` and ``--no-peer``: the interpreter of the peer library's
    virtualenv, or no peer."""
    found.add_argument("--no-peer", action="store_true", help=f"skip {name}")
    found.add_argument("--peer-python", help=python_help)
