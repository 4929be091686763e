"""Per-period samples of the daemon, its spawner sidecar, the provider processes and the
driver's own processes, read from /proc (see ``bench.procfs``).

One `Sample` per period (1 s by default, 100 ms for a burst), with the size of the
daemon's database file and its WAL (retention should make it level off), and with
``snapshot_log_s`` the item snapshots still in its log. The spawner is looked up by
its socket path until found (it may start after the daemon, or restart); when it is never
found it is reported absent, not as 0. Every provider process seen is remembered (pid and
start time) so the coordinator can check that none outlives the daemon, and so is every
direct child of the daemon other than the spawner (processes the daemon created itself;
one that lives less than a sample period can be missed). The daemon's CPU is also read
split: its kernel time, its loop's thread and its writer thread (found by name).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

import attrs
import trio

from bench import procfs

WRITER_THREAD = "t3d-writer"  # the name t3d.store.writer gives its thread


@attrs.frozen
class Sample:
    t: float
    daemon_rss: float | None
    daemon_pss: float | None
    daemon_cpu: float | None
    spawner_rss: float | None
    spawner_pss: float | None
    spawner_cpu: float | None
    providers: int
    providers_rss: float
    driver_cpu: float | None
    providers_cpu: float
    machine_busy: int  # jiffies of all CPUs, busy and total (/proc/stat)
    machine_total: int
    git_calls: int | None
    # The database file and its WAL, in MiB (None before the daemon created them).
    db_mib: float | None = None
    wal_mib: float | None = None
    # The item snapshots still holding a payload in the log (not compacted), in MiB, read
    # every ``snapshot_log_s`` (None between readings, and without --snapshot-log).
    snapshot_log_mib: float | None = None
    # The daemon's CPU seconds in the kernel, and those of its loop's thread and of its
    # writer thread (user + kernel each): where `daemon_cpu` goes.
    daemon_kernel_cpu: float | None = None
    daemon_loop_cpu: float | None = None
    daemon_writer_cpu: float | None = None


@attrs.define
class Sampler:
    daemon_pid: int
    spawner_socket: str
    git_log: str | None
    db_path: str | None = None
    snapshot_log_s: float | None = None
    driver_pids: list[int] = attrs.field(factory=list)
    samples: list[Sample] = attrs.field(factory=list)
    spawner: procfs.ProcessId | None = None
    spawner_seen: bool = False
    providers_seen: set[procfs.ProcessId] = attrs.field(factory=set)
    # Processes the daemon itself started (its direct children), the spawner aside.
    daemon_children_seen: set[procfs.ProcessId] = attrs.field(factory=set)
    _next_snapshot_log: float = 0.0
    _writer: tuple[int, int | None] | None = None  # (daemon pid, its writer thread's id)

    def _daemon_cpu(self) -> dict[str, float | None]:
        """The daemon's CPU, its kernel part, and its loop's and writer's threads' CPU (None:
        not found, e.g. before the writer started); the process's stat is read once."""
        pid = self.daemon_pid
        if self._writer is None or self._writer[0] != pid or self._writer[1] is None:
            self._writer = (pid, procfs.thread_named(pid, WRITER_THREAD))
        process, loop = procfs.cpu_split_s(pid), procfs.cpu_split_s(pid, pid)
        writer = procfs.cpu_split_s(pid, self._writer[1]) if self._writer[1] is not None else None
        return {
            "daemon_cpu": sum(process) if process else None,
            "daemon_kernel_cpu": process[1] if process else None,
            "daemon_loop_cpu": sum(loop) if loop else None,
            "daemon_writer_cpu": sum(writer) if writer else None,
        }

    def sample_once(self) -> Sample:
        if self.spawner is None or not self.spawner.alive():
            pid = procfs.find_spawner(self.spawner_socket)
            self.spawner = procfs.ProcessId.of(pid) if pid is not None else None
            self.spawner_seen = self.spawner_seen or self.spawner is not None
        roots = [self.daemon_pid] + ([self.spawner.pid] if self.spawner else [])
        providers = [
            p for p in procfs.descendants(roots) if self.spawner is None or p != self.spawner.pid
        ]
        rss_total = cpu_total = 0.0
        for pid in providers:
            rss = procfs.statm_rss_mib(pid)
            cpu = procfs.cpu_s(pid)
            if rss is not None and cpu is not None:
                rss_total += rss
                cpu_total += cpu
                ident = procfs.ProcessId.of(pid)
                if ident is not None:
                    self.providers_seen.add(ident)
        spawner = self.spawner.pid if self.spawner else None
        for pid in procfs.children(self.daemon_pid):
            if pid != spawner and (ident := procfs.ProcessId.of(pid)) is not None:
                self.daemon_children_seen.add(ident)
        driver = [procfs.cpu_s(p) for p in [os.getpid(), *self.driver_pids]]
        busy, total = procfs.machine_cpu()
        now = time.monotonic()
        snapshot_log = None
        if self.snapshot_log_s and self.db_path and now >= self._next_snapshot_log:
            self._next_snapshot_log = now + self.snapshot_log_s
            snapshot_log = _snapshot_log_mib(self.db_path)
        sample = Sample(
            t=now,
            daemon_rss=procfs.rss_mib(self.daemon_pid),
            daemon_pss=procfs.pss_mib(self.daemon_pid),
            spawner_rss=procfs.rss_mib(spawner) if spawner else None,
            spawner_pss=procfs.pss_mib(spawner) if spawner else None,
            spawner_cpu=procfs.cpu_s(spawner) if spawner else None,
            providers=len(providers),
            providers_rss=rss_total,
            driver_cpu=sum(c for c in driver if c is not None),
            providers_cpu=cpu_total,
            machine_busy=busy,
            machine_total=total,
            git_calls=_git_calls(self.git_log),
            db_mib=_file_mib(self.db_path),
            wal_mib=_file_mib(f"{self.db_path}-wal" if self.db_path else None),
            snapshot_log_mib=snapshot_log,
            **self._daemon_cpu(),
        )
        self.samples.append(sample)
        return sample

    async def run(self, period_s: float) -> None:
        while True:
            started = time.monotonic()
            await trio.to_thread.run_sync(self.sample_once)
            await trio.sleep(max(0.0, started + period_s - time.monotonic()))


def _file_mib(path: str | None) -> float | None:
    if path is None:
        return None
    try:
        return round(os.stat(path).st_size / 2**20, 2)
    except FileNotFoundError:
        return None


def _snapshot_log_mib(path: str) -> float | None:
    """The payload bytes of the item snapshots in the log (``item.updated`` events not
    compacted), in MiB: what retention deletes once superseded and old enough. Read from
    the database file read-only, in the driver (one scan of the events table; `length`
    of a blob reads no overflow pages)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            (total,) = db.execute(
                "SELECT total(length(payload)) FROM events WHERE kind = 'item.updated' AND length(payload) > 0"
            ).fetchone()
    except sqlite3.Error:
        return None  # not created yet, or busy past the timeout: no reading this time
    return round(float(total) / 2**20, 2)


def _git_calls(log: str | None) -> int | None:
    """Git processes started so far: the git shim appends one 2-byte line per call."""
    if log is None:
        return None
    try:
        return os.stat(log).st_size // 2
    except FileNotFoundError:
        return 0
