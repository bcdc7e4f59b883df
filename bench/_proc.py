"""What a process has used, read from ``/proc``: CPU time (of a process, of each of its
threads) and resident memory."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int | str = "self", task: int | None = None) -> list[str]:
    """The fields of a process's (or one of its threads') ``stat`` after its name: the
    state is ``[0]``, the parent ``[1]``, utime ``[11]``, stime ``[12]``, cutime ``[13]``,
    cstime ``[14]``. Raises ``OSError`` once it has ended."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    return Path(path).read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int | str = "self", children: bool = False) -> float:
    """The CPU time (user and system) a process has used; with ``children``, that of its
    ended children too."""
    fields = stat_fields(pid)
    return sum(int(field) for field in fields[11 : 15 if children else 13]) / TICK


def cpu_seconds_or_none(pid: int | str) -> float | None:
    """:func:`cpu_seconds`, or None where ``/proc`` does not tell (the process ended)."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def thread_cpu(pid: int | str = "self") -> dict[int, float]:
    """CPU seconds (user and system) of each thread of a process, by thread id."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = stat_fields(pid, int(tid))
        except OSError:
            continue  # (it ended meanwhile)
        found[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return found


def thread_name(tid: int, pid: int | str = "self") -> str:
    """A thread's name (librdkafka names its own ``rdk:main``, ``rdk:broker-1``, ...), or ""
    once it has ended."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def rss_bytes(pid: int | str = "self") -> int | None:
    """A process's resident memory, or None where ``/proc`` does not tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
