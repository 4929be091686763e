"""What /proc says about the daemon and the processes around it.

Parsers are pure (text in, numbers out); the ``read_*`` and ``find_*`` functions read
/proc and treat a process that vanished while being read as absent (``None``), never as 0.

* RSS: ``VmRSS`` of /proc/PID/status; PSS: ``Pss`` of /proc/PID/smaps_rollup (the daemon
  and the spawner only: it walks the page tables, too slow for hundreds of providers).
* CPU seconds: utime + stime of /proc/PID/stat, in clock ticks.
* Provider processes: descendants of the daemon and of the spawner, found through
  /proc/PID/task/TID/children; their RSS is ``resident`` of /proc/PID/statm.
* The spawner sidecar: a process whose command line has ``-m spawner`` and
  ``--socket STATE_DIR/spawner.sock``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

import attrs

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def parse_status_kib(text: str, field: str) -> int | None:
    """A ``Field:   123 kB`` line of /proc/PID/status (or smaps_rollup), in KiB."""
    prefix = field + ":"
    for line in text.splitlines():
        if line.startswith(prefix):
            return int(line.split()[1])
    return None


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc stat line after the command name, which is in parentheses
    and may hold spaces or parentheses itself."""
    return text[text.rindex(")") + 2 :].split()


def parse_stat(text: str) -> tuple[int, float, int]:
    """(ppid, CPU seconds = utime + stime, start time in ticks) from /proc/PID/stat."""
    rest = _stat_fields(text)
    ppid, utime, stime, start = int(rest[1]), int(rest[11]), int(rest[12]), int(rest[19])
    return ppid, (utime + stime) / CLOCK_TICKS, start


def parse_stat_split(text: str) -> tuple[float, float]:
    """(user, kernel) CPU seconds from /proc/PID/stat or /proc/PID/task/TID/stat."""
    rest = _stat_fields(text)
    return int(rest[11]) / CLOCK_TICKS, int(rest[12]) / CLOCK_TICKS


def parse_statm_rss_bytes(text: str) -> int:
    return int(text.split()[1]) * PAGE_BYTES


def parse_proc_stat_cpu(text: str) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's ``cpu`` line (idle and iowait are not busy)."""
    fields = [int(v) for v in text.splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


def machine_cpu() -> tuple[int, int]:
    return parse_proc_stat_cpu((PROC / "stat").read_text())


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def rss_mib(pid: int) -> float | None:
    text = _read(PROC / str(pid) / "status")
    kib = parse_status_kib(text, "VmRSS") if text else None
    return None if kib is None else kib / 1024


def pss_mib(pid: int) -> float | None:
    text = _read(PROC / str(pid) / "smaps_rollup")
    kib = parse_status_kib(text, "Pss") if text else None
    return None if kib is None else kib / 1024


def cpu_s(pid: int) -> float | None:
    split = cpu_split_s(pid)
    return None if split is None else sum(split)


def cpu_split_s(pid: int, tid: int | None = None) -> tuple[float, float] | None:
    """(user, kernel) CPU seconds of process ``pid``, or of its thread ``tid``."""
    text = _read(PROC / str(pid) / "stat") if tid is None else _read(PROC / str(pid) / "task" / str(tid) / "stat")
    return None if text is None else parse_stat_split(text)


def thread_named(pid: int, name: str) -> int | None:
    """The id of the first thread of ``pid`` whose name (``comm``) is ``name``."""
    try:
        tids = sorted(int(t) for t in os.listdir(PROC / str(pid) / "task"))
    except OSError:
        return None
    return next((tid for tid in tids if (_read(PROC / str(pid) / "task" / str(tid) / "comm") or "").strip() == name), None)


def start_ticks(pid: int) -> int | None:
    text = _read(PROC / str(pid) / "stat")
    return None if text is None else parse_stat(text)[2]


def statm_rss_mib(pid: int) -> float | None:
    text = _read(PROC / str(pid) / "statm")
    return None if text is None else parse_statm_rss_bytes(text) / MIB


def children(pid: int) -> list[int]:
    """Direct children of every thread of ``pid``."""
    out: list[int] = []
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except (FileNotFoundError, ProcessLookupError):
        return out
    for tid in tasks:
        text = _read(PROC / str(pid) / "task" / tid / "children")
        if text:
            out.extend(int(c) for c in text.split())
    return out


def descendants(roots: Iterable[int]) -> list[int]:
    seen: list[int] = []
    stack = list(roots)
    while stack:
        for child in children(stack.pop()):
            if child not in seen:
                seen.append(child)
                stack.append(child)
    return seen


def cmdline(pid: int) -> list[str]:
    raw = _read_bytes(PROC / str(pid) / "cmdline")
    return [] if not raw else raw.rstrip(b"\0").decode(errors="replace").split("\0")


def is_spawner(argv: list[str], socket: str) -> bool:
    """Pure: does this command line belong to the spawner sidecar serving ``socket``?"""
    has_module = any(a == "-m" and b == "spawner" for a, b in itertools.pairwise(argv))
    has_module = has_module or "-mspawner" in argv
    has_socket = any(a == "--socket" and b == socket for a, b in itertools.pairwise(argv))
    return has_module and (has_socket or f"--socket={socket}" in argv)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def find_spawner(socket: str) -> int | None:
    for pid in all_pids():
        if is_spawner(cmdline(pid), socket):
            return pid
    return None


@attrs.frozen
class ProcessId:
    """A pid with its start time, so a reused pid is never mistaken for ours."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        start = start_ticks(pid)
        return None if start is None else cls(pid, start)

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.start


def processes_under(path: str) -> list[int]:
    """Processes whose working directory or command line lies under ``path``."""
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        try:
            cwd = os.readlink(PROC / str(pid) / "cwd")
        except OSError:
            cwd = ""
        if cwd.startswith(path) or any(path in a for a in cmdline(pid)):
            found.append(pid)
    return found
