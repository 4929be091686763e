"""What /proc says about the agents' process groups and the daemon itself. Blocking.

`read_groups` finds each agent's process group (the provider and everything it started
that stayed in its group) in one pass over /proc and adds up their RSS (``statm``
resident pages) and CPU time (``stat``: user + system, plus that of reaped children, so
a tool that ran and exited still counts). Run it in a worker thread (`Observer.agents`);
`own_rss_bytes` is one read of /proc/self/statm (procfs: no disk), cheap enough for the
loop. A process that vanished while being read is left out. Bounded: at most
`readers.MAX_PROC_ENTRIES` /proc entries per call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import attrs

from t3d.pressure.readers import group_members

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@attrs.frozen
class Usage:
    rss_bytes: int
    cpu_s: float
    processes: int = 1


def parse_stat_cpu_s(text: str) -> float:
    """utime + stime + cutime + cstime of a /proc/PID/stat line, in seconds. Pure."""
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces or parentheses
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def parse_statm_rss_bytes(text: str) -> int:
    return int(text.split()[1]) * PAGE_BYTES


def read_process(pid: int, proc: Path = PROC) -> Usage | None:
    """One process's RSS and CPU, or None if it is gone."""
    try:
        with open(proc / str(pid) / "stat") as f:
            cpu = parse_stat_cpu_s(f.read())
        with open(proc / str(pid) / "statm") as f:
            rss = parse_statm_rss_bytes(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return Usage(rss, cpu)


def read_groups(pgids: Iterable[int], proc: Path = PROC) -> dict[int, Usage]:
    """Each process group's summed RSS and CPU, by its id (a group with nothing left is absent)."""
    wanted = set(pgids)
    if not wanted:
        return {}
    out = {}
    for pgid, pids in group_members(proc, wanted).items():
        usages = [u for u in (read_process(pid, proc) for pid in pids or [pgid]) if u is not None]
        if usages:
            out[pgid] = Usage(sum(u.rss_bytes for u in usages), sum(u.cpu_s for u in usages), len(usages))
    return out


def own_rss_bytes() -> int | None:
    """The daemon's RSS now, or None if /proc cannot say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None
