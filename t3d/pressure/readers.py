"""Reading memory pressure and agent sizes from the kernel's files. Blocking; no processes.

Run in a worker thread (`PressureSampler` does). Nothing here spawns anything:
under memory pressure a new process may fail to start, which is exactly when
the reading matters.

Where things are, all under ``root`` (`T3D_PSI_ROOT`, default ``/``, so tests
and demos can point at fixture files):

- the host: ``proc/pressure/memory``;
- the agents' cgroup (present only where providers run in systemd scopes under
  `AGENTS_SLICE`): ``sys/fs/cgroup/user.slice/user-UID.slice/user@UID.service/t3d-agents.slice``,
  its ``memory.pressure``, and each agent scope's ``memory.current``.

Agents without a scope are sized by the PSS of their process group, read from
the real ``/proc/<pid>/smaps_rollup`` (the processes are real even when the
PSI files are fixtures).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import attrs

from t3d.pressure.core import AgentMemory, Psi, PsiFormatError, Sample, parse_psi

AGENTS_SLICE = "t3d-agents.slice"
# Bound the work of one sample: at most this many /proc entries are looked at.
MAX_PROC_ENTRIES = 100_000
MAX_PSI_BYTES = 4096


@attrs.frozen
class AgentProcess:
    """A live provider process as the sessions know it."""

    thread_id: str
    pid: int  # also its process group id
    scope: str | None  # the systemd scope unit it runs in, if any


@attrs.frozen
class Reading:
    sample: Sample
    unavailable: str | None  # why no source could be read (None: at least one was)


def agents_cgroup(root: Path, uid: int) -> Path:
    return (
        root
        / "sys/fs/cgroup/user.slice"
        / f"user-{uid}.slice"
        / f"user@{uid}.service"
        / AGENTS_SLICE
    )


def _read_psi(path: Path) -> Psi:
    with open(path, "rb") as f:
        return parse_psi(f.read(MAX_PSI_BYTES).decode("ascii", "replace"))


def read_sample(root: Path, uid: int) -> Reading:
    """One reading of the host's PSI and the agents' cgroup PSI (each may be missing)."""
    problems = []
    host_path = root / "proc/pressure/memory"
    try:
        host: Psi | None = _read_psi(host_path)
    except FileNotFoundError:
        host = None
        problems.append(
            f"no PSI at {host_path} (a kernel without CONFIG_PSI, or psi=0 on its command line)"
        )
    except (OSError, PsiFormatError) as exc:
        host = None
        problems.append(f"cannot read {host_path}: {exc}")
    agents_path = agents_cgroup(root, uid) / "memory.pressure"
    try:
        agents: Psi | None = _read_psi(agents_path)
    except FileNotFoundError:
        agents = None  # agents do not run in their own cgroup here: not a problem
    except (OSError, PsiFormatError) as exc:
        agents = None
        problems.append(f"cannot read {agents_path}: {exc}")
    sample = Sample(host, agents)
    return Reading(sample, None if sample.readable else "; ".join(problems) or "no PSI source")


def _pgid_of(stat: str) -> int | None:
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[2]) if len(fields) > 2 else None


def group_members(proc: Path, pgids: set[int]) -> dict[int, list[int]]:
    """Pids of the processes in each process group of ``pgids`` (a provider and its
    children), from one pass over ``proc``."""
    members: dict[int, list[int]] = {pgid: [] for pgid in pgids}
    try:
        entries = os.scandir(proc)
    except OSError:
        return members
    with entries:
        for count, entry in enumerate(entries):
            if count >= MAX_PROC_ENTRIES:
                break
            if not entry.name.isdigit():
                continue
            try:
                with open(os.path.join(entry.path, "stat")) as f:
                    pgid = _pgid_of(f.read())
            except (OSError, ValueError):
                continue  # gone meanwhile
            if pgid in members:
                members[pgid].append(int(entry.name))
    return members


def pss_bytes(proc: Path, pid: int) -> int:
    """A process's proportional set size, from smaps_rollup; 0 if it cannot be read."""
    try:
        with open(proc / str(pid) / "smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _scope_bytes(root: Path, uid: int, scope: str) -> int | None:
    try:
        with open(agents_cgroup(root, uid) / f"{scope}.scope" / "memory.current") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def agent_sizes(
    root: Path, uid: int, agents: Iterable[AgentProcess], proc: Path = Path("/proc")
) -> list[AgentMemory]:
    """Each agent's memory: its scope's ``memory.current``, else its process group's PSS."""
    sizes = []
    unscoped = []
    for agent in agents:
        if (
            agent.scope is not None
            and (current := _scope_bytes(root, uid, agent.scope)) is not None
        ):
            sizes.append(AgentMemory(agent.thread_id, current, "scope"))
        else:
            unscoped.append(agent)
    groups = group_members(proc, {agent.pid for agent in unscoped}) if unscoped else {}
    for agent in unscoped:
        pss = sum(pss_bytes(proc, pid) for pid in groups.get(agent.pid) or [agent.pid])
        if pss > 0:
            sizes.append(AgentMemory(agent.thread_id, pss, "pss"))
    return sizes
