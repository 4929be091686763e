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
import resource
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


@attrs.frozen
class OwnProcess:
    """The daemon's own figures for the ``process_*`` metrics."""

    rss_bytes: int
    virtual_bytes: int
    cpu_s: float  # user + system, this process only
    start_ticks: int  # clock ticks after boot
    open_fds: int
    max_fds: int


def boot_time(proc: Path = PROC) -> float | None:
    """When the machine booted (seconds since the epoch), from /proc/stat's btime."""
    try:
        with open(proc / "stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def own_process() -> OwnProcess | None:
    """/proc/self/stat (one read) and the size of /proc/self/fd; None if /proc cannot say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
        fields = text[text.rindex(")") + 2 :].split()
        open_fds = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return OwnProcess(
        rss_bytes=int(fields[21]) * PAGE_BYTES,
        virtual_bytes=int(fields[20]),
        cpu_s=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
        start_ticks=int(fields[19]),
        open_fds=open_fds,
        max_fds=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    )
