"""The shell kept in memory, on the loop, from commits: served without a database read. Pure.

`ShellRows` holds every thread's shell row (the bytes `shell_payload` makes, with its
``workspace`` spliced in as `with_workspace` does), in thread creation order (the order
of ``threads.rowid``, as a shell read returns them), every project's row (its stored
body), and the sequence of the last commit it reflects. Serving it joins cached bytes: a
steady shell costs no Python per row.

Theory of operation:
- It is filled once from one shell read (`begin_seed` right before the read starts,
  then `seed` with what it found). Commits that arrive while the read runs are kept by
  sequence and merged: a row committed after the read's sequence wins over the read's,
  a thread deleted after it goes, a thread created after it is appended (nothing lost,
  nothing resurrected).
- Then every commit is applied in commit order (`apply`, called from the hub's publish
  path, t3d/live/hub.py, on the loop right after COMMIT): each shell row the writer
  computed for the commit (`Committed.shell`: the touched threads' rows, once per commit)
  replaces the thread's row or, for a new thread, is appended (a new thread has the
  highest rowid); a deleted thread's row goes; a ``project.updated`` event replaces or
  appends its project (its payload is the stored body). The sequence is the commit's
  last event's, as the read's (``sqlite_sequence``) would be.
- Workspace values (t3d/git/workspaces.py) are not events. A row's spliced bytes are
  remade only when its row changed, or when its thread's workspace value may have:
  `workspace_changed` (the hub's `publish_workspace`) marks those threads, and a project
  update marks every thread (the statuses remap a project's threads silently), rechecked
  by identity of the value at the next serve.
- Item updates alone do not move a shell row (commit.py `SHELL_KINDS`): mid-turn, a
  row's ``item_count`` lags a fresh read exactly as the live shell subscription's rows
  do, and catches up with the turn's next update (at the latest its terminal one).

Writes that change threads, turns, thread_counts or projects rows without the writer's
commit publication, and what each does here:
- Retention (t3d/store/pruner.py, retention.py, `Store.maintain`): deletes and compacts
  events, the purge queue, outbox rows and marks; a deleted thread's rows went with its
  ``thread.deleted`` commit. Touches no shell column: nothing to publish.
- Maintenance (maintenance.py: vacuum, WAL checkpoint, check, stats, backup): no row
  changes. Nothing to publish.
- Restart recovery (`Store.recover_after_restart`): its row changes are a published
  commit (``RecoverAfterRestart``); its outbox step touches only the outbox.
- Migrations and restoring a database file: only before the daemon serves (open_store,
  or with the daemon stopped); the cache starts unseeded in every daemon and seeds on
  first use, after them.
Anything new that writes those tables outside a published commit must call `invalidate`
(the next use seeds again).

Bounds: one row per thread and one per project, the size of a shell response; no other
growth (the seed's overlay holds at most one row per thread touched during the read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs

from t3d.live.wire import with_workspace
from t3d.store.commit import Committed

WORKSPACE_KEY = b',"workspace":'


def _no_workspace(_thread_id: str) -> bytes | None:
    return None


@attrs.frozen
class ShellCopy:
    """An immutable view of the shell at ``sequence``: encoded project and thread rows."""

    sequence: int
    projects: tuple[bytes, ...]
    threads: tuple[bytes, ...]


@attrs.frozen
class Seed:
    """What a shell read found, made ready on the reader thread: its sequence, project id ->
    body, thread id -> row as served (workspace spliced in) in rowid order, and thread id ->
    the workspace value spliced into it (taken on the loop right before the read)."""

    sequence: int
    projects: dict[str, bytes]
    threads: dict[str, bytes]
    spliced: dict[str, bytes]


def seed_of(
    sequence: int, projects: Iterable[tuple[str, bytes]], threads: Iterable[tuple[str, bytes]], workspaces: Mapping[str, bytes]
) -> Seed:
    """A `Seed` from a read's rows (id, row without workspace), spliced with ``workspaces``."""
    rows: dict[str, bytes] = {}
    spliced: dict[str, bytes] = {}
    for thread_id, row in threads:
        value = workspaces.get(thread_id)
        if value is not None:
            spliced[thread_id] = value
        rows[thread_id] = with_workspace(row, value)
    return Seed(sequence, dict(projects), rows, spliced)


def shell_chunks(shell: ShellCopy, budget: int) -> Iterator[bytes]:
    """The subscribe.shell snapshot's chunk objects, one at a time: exactly what
    chunks.py's `chunk_objects` makes of the same rows as `Parts` (same sizes, same cuts),
    without building a pair per row first."""
    empty_lists = len("projects") + 6 + len("threads") + 6
    head = b'"sequence":%d' % shell.sequence
    size, count = 2 + empty_lists + len(head) + 1, 0
    lists: tuple[list[bytes], list[bytes]] = ([], [])
    for index, elements in enumerate((shell.projects, shell.threads)):
        for element in elements:
            grown = len(element) + (1 if lists[index] else 0)
            if count and size + grown > budget:
                yield _shell_chunk(head, lists)
                head, lists = b"", ([], [])
                size, count = 2 + empty_lists, 0
                grown = len(element)
            lists[index].append(element)
            size += grown
            count += 1
    yield _shell_chunk(head, lists)


def _shell_chunk(head: bytes, lists: tuple[list[bytes], list[bytes]]) -> bytes:
    projects, threads = b",".join(lists[0]), b",".join(lists[1])
    return b"{%s%s\"projects\":[%s],\"threads\":[%s]}" % (head, b"," if head else b"", projects, threads)


class ShellRows:
    def __init__(self, workspace: Callable[[str], bytes | None] = _no_workspace) -> None:
        # Thread id -> its workspace value now (the hub's `WorkspaceView.row`).
        self.workspace = workspace
        self.sequence = 0
        # Thread id -> its row as served (workspace spliced in), in creation order.
        self._wire: dict[str, bytes] = {}
        # Thread id -> the workspace value spliced into its row (absent: none).
        self._spliced: dict[str, bytes] = {}
        self._projects: dict[str, bytes] = {}
        # Threads whose workspace value may have changed; every thread's, after a project update.
        self._dirty: set[str] = set()
        self._all_dirty = False
        self.seeded = False
        # While a seed read runs: what commits changed since (id -> (sequence, row or None)).
        self._while_threads: dict[str, tuple[int, bytes | None]] | None = None
        self._while_projects: dict[str, tuple[int, bytes]] | None = None
        self.seeds = 0
        # The rows as last copied (None: changed since): a copy after commits that moved no
        # row (item updates) shares the same tuple, and so do the pieces made of it.
        self._threads_copy: tuple[bytes, ...] | None = None
        self._projects_copy: tuple[bytes, ...] | None = None

    # --- seeding ---------------------------------------------------------------------------

    @property
    def seeding(self) -> bool:
        return self._while_threads is not None

    def begin_seed(self) -> None:
        """Call right before the seed read starts (its transaction must begin after this)."""
        self._while_threads, self._while_projects = {}, {}
        self._dirty, self._all_dirty = set(), False

    def abort_seed(self) -> None:
        self._while_threads = self._while_projects = None

    def invalidate(self) -> None:
        """Forget everything; the next use seeds again."""
        self.abort_seed()
        self.seeded = False
        self.sequence = 0
        self._wire, self._spliced, self._projects = {}, {}, {}
        self._threads_copy = self._projects_copy = None
        self._dirty, self._all_dirty = set(), False

    def seed(self, found: Seed) -> None:
        """Merge what the seed read found with the commits applied since `begin_seed`. The
        read's rows are taken whole; only rows committed after its sequence are applied over
        them (a deleted thread goes, a new one is appended in commit order)."""
        threads = self._while_threads or {}
        projects = self._while_projects or {}
        self.abort_seed()
        head = found.sequence
        self._wire, self._spliced, self._projects = found.threads, found.spliced, found.projects
        self._threads_copy = self._projects_copy = None
        for thread_id, (sequence, row) in threads.items():  # in first-touch order: creation order
            if sequence <= head:
                continue  # the read saw this commit (or a later one)
            if row is None:
                self._wire.pop(thread_id, None)
                self._spliced.pop(thread_id, None)
            else:
                self._set(thread_id, row, self.workspace(thread_id))
        for project_id, (sequence, body) in projects.items():
            if sequence > head:
                self._projects[project_id] = body
        # Workspace values that changed during the read (`_dirty`, `_all_dirty`) are rechecked
        # at the next serve.
        self.sequence = max(head, self.sequence)
        self.seeded = True
        self.seeds += 1

    # --- commits ---------------------------------------------------------------------------

    def apply(self, committed: Committed) -> None:
        """One commit, in commit order (the hub's publish path)."""
        if not committed.events or not (self.seeded or self.seeding):
            return
        self.sequence = max(self.sequence, committed.events[-1].sequence)
        while_projects = self._while_projects
        for event in committed.events:
            if event.kind == "project.updated":
                self._projects[event.entity.id] = event.payload
                self._projects_copy = None
                self._all_dirty = True
                if while_projects is not None:
                    while_projects[event.entity.id] = (event.sequence, event.payload)
        while_threads = self._while_threads
        for row in committed.shell:
            if while_threads is not None:
                while_threads[row.thread_id] = (row.sequence, row.payload)
            if row.payload is None:
                self._wire.pop(row.thread_id, None)
                self._threads_copy = None
                self._spliced.pop(row.thread_id, None)
                self._dirty.discard(row.thread_id)
            else:
                self._set(row.thread_id, row.payload, self.workspace(row.thread_id))

    def workspace_changed(self, thread_ids: Iterable[str]) -> None:
        """These threads' workspace value changed (recomputed at the next serve)."""
        if self.seeded or self.seeding:
            self._dirty.update(thread_ids)

    # --- serving ---------------------------------------------------------------------------

    def copy(self) -> ShellCopy:
        """The shell now, as immutable tuples of encoded rows (the same tuple objects as the
        last copy's while no row changed)."""
        self._refresh()
        if self._threads_copy is None:
            self._threads_copy = tuple(self._wire.values())
        if self._projects_copy is None:
            self._projects_copy = tuple(self._projects.values())
        return ShellCopy(self.sequence, self._projects_copy, self._threads_copy)

    def __len__(self) -> int:
        return len(self._wire)

    def _refresh(self) -> None:
        if self._all_dirty:
            spliced, workspace = self._spliced, self.workspace
            for thread_id in list(self._wire):
                value = workspace(thread_id)
                if value is not spliced.get(thread_id):
                    self._set(thread_id, self._row(thread_id), value)
            self._all_dirty = False
            self._dirty.clear()
        elif self._dirty:
            for thread_id in self._dirty:
                if thread_id in self._wire:
                    self._set(thread_id, self._row(thread_id), self.workspace(thread_id))
            self._dirty.clear()

    def _row(self, thread_id: str) -> bytes:
        """The thread's row without its workspace."""
        wire = self._wire[thread_id]
        value = self._spliced.get(thread_id)
        if value is None:
            return wire
        return wire[: len(wire) - len(value) - len(WORKSPACE_KEY) - 1] + b"}"

    def _set(self, thread_id: str, row: bytes, value: bytes | None) -> None:
        self._threads_copy = None
        self._wire[thread_id] = with_workspace(row, value)
        if value is None:
            self._spliced.pop(thread_id, None)
        else:
            self._spliced[thread_id] = value
