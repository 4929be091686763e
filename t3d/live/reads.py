"""Reading subscription bases and snapshots from the store, never on the loop.

Every read runs on the reader pool (`Store.read`); summarizing and chunking
happen there too, right after the transaction. Fresh snapshots of the same
thing (the shell, or one thread at one ``turn_limit``) that are asked for at
once share one read (`SharedReads`): a wave of resyncs costs one read.

The shell is the exception: `GET /api/shell`, the fresh ``subscribe.shell`` snapshot
and MCP's shell are served from the hub's in-memory rows (shell_rows.py), filled by one
read on first use (`_shell_copy`) and joined on the loop from then on, piece by piece
(with a checkpoint between pieces) when large. A shell resume's replay is still read.

Resume bounds: a gap of at most `REPLAY_MAX_EVENTS` events and
`REPLAY_MAX_BYTES` (stored payload bytes) is replayed; a larger one gets a
fresh snapshot from the same read transaction. The shell's replay also looks
at no more than `SHELL_SCAN_MAX` events of any kind.

Read classes (read_classes.py): the shell and pending requests are small; a
snapshot of the latest turns is a page (`snapshot_read_class`); history pages,
resume replays and `detail` (the full value of a huge field) are history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import orjson
import trio
import trio.lowlevel

from t3d.live import base as b
from t3d.live.chunks import (
    CHUNK_BYTES,
    CHUNK_DATA_BYTES,
    Parts,
    chunk_objects,
    object_bytes,
    object_pieces,
)
from t3d.live.shared import SharedReads, Wave
from t3d.live.shell_rows import Seed, ShellCopy, ShellRows, seed_of, shell_chunks
from t3d.live.wire import Path, summarize_payload, value_at
from t3d.store import queries as q
from t3d.store.commit import shell_payload
from t3d.store.read_classes import ReadClass
from t3d.store.replay import shell_resume_query, thread_resume_query
from t3d.store.store import Store

REPLAY_MAX_EVENTS = 128
REPLAY_MAX_BYTES = 1024 * 1024
SHELL_SCAN_MAX = 4096

if TYPE_CHECKING:
    import apsw

R = TypeVar("R")

# A snapshot's key: (thread id, turn_limit), or (None, 0) for the shell.
SnapshotKey = tuple[str | None, int]


def _no_workspaces() -> Mapping[str, bytes]:
    return b.NO_WORKSPACES


class BaseReader:
    def __init__(
        self,
        store: Store,
        *,
        share: bool = True,
        workspaces: Callable[[], Mapping[str, bytes]] = _no_workspaces,
        shell_rows: ShellRows | None = None,
    ) -> None:
        self._store = store
        # The in-memory shell (shell_rows.py), kept from commits by the hub: when given, the
        # shell is served from it (seeded by one read on first use) instead of a read each time.
        self._shell_rows = shell_rows
        self._seeding = trio.Lock()
        # The thread rows of the last shell served from memory, and its pieces: reused while
        # no row changed (commits of item updates move only the sequence). One response's worth.
        self._thread_pieces: tuple[tuple[bytes, ...], list[bytes]] | None = None
        self._share = share
        # Thread id -> its workspace status (encoded), copied on the loop before each shell
        # read: the rows read carry the values of that moment (t3d/live/hub.py).
        self._workspaces = workspaces
        self._snapshots: SharedReads[SnapshotKey, b.Snapshot | None] = SharedReads(self._read_snapshot, share=share)
        # Polls of the shell (GET /api/shell): one read at a time; the polls that arrive
        # while it runs gather in the next wave and share its read, so many pollers of a
        # large shell cost at most one read in flight (each still gets a read that began
        # after it asked).
        self._shell_reads: SharedReads[None, list[bytes] | None] = SharedReads(self._read_shell_pieces, share=share)
        self._one_shell_read = trio.Lock()

    def join_snapshot(self, key: SnapshotKey) -> Wave[SnapshotKey, b.Snapshot | None]:
        """Join the current wave of fresh snapshots of ``key``; await its result later.
        Its read starts no earlier than this call. None: the thread does not exist."""
        return self._snapshots.join(key)

    async def _read_snapshot(self, key: SnapshotKey) -> b.Snapshot | None:
        thread_id, turn_limit = key
        if thread_id is None and self._shell_rows is not None:
            return await shell_copy_snapshot(await self._shell_copy())
        if thread_id is None:
            workspaces = self._workspaces()
            return await self._store.read(q.shell_query, lambda raw: b.decode_shell_snapshot(raw, workspaces), ReadClass.SMALL)
        query = q.snapshot_query(thread_id, turn_limit, None)
        return await self._store.read(query, b.decode_thread_snapshot, q.snapshot_read_class(turn_limit, None))

    async def thread_base(self, thread_id: str, turn_limit: int, after: int | None) -> b.Base | None:
        """What a thread subscriber needs first: a replay since ``after``, or a snapshot."""
        if after is None:
            return await self.join_snapshot((thread_id, turn_limit)).result()
        query = thread_resume_query(thread_id, after, turn_limit, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES)
        return await self._store.read(query, b.decode_thread_resume, ReadClass.HISTORY)

    async def shell_base(self, after: int | None) -> b.Base:
        if after is None:
            snapshot = await self.join_snapshot((None, 0)).result()
            assert snapshot is not None
            return snapshot
        query = shell_resume_query(after, REPLAY_MAX_EVENTS, REPLAY_MAX_BYTES, SHELL_SCAN_MAX)
        workspaces = self._workspaces()
        return await self._store.read(query, lambda raw: b.decode_shell_resume(raw, workspaces), ReadClass.HISTORY)

    # --- whole snapshots, for request/response (RPC, HTTP) ------------------------------

    async def thread_snapshot_pieces(self, thread_id: str, turn_limit: int, before: int | None, children: bool = False) -> list[bytes] | None:
        """The thread snapshot as one JSON object in pieces of at most 256 KiB (HTTP)."""
        query = q.snapshot_query(thread_id, turn_limit, before, children)
        return await self._store.read(query, _pieces(b.thread_parts), q.snapshot_read_class(turn_limit, before))

    async def thread_snapshot(self, thread_id: str, turn_limit: int, before: int | None, chunk_bytes: int, children: bool = False) -> b.Snapshot | None:
        """The thread snapshot as chunk objects of at most ``chunk_bytes`` each (a streamed
        ``thread.snapshot`` reply on a WebSocket)."""

        def decode(raw: q.SnapshotRaw) -> b.Snapshot | None:
            parts = b.thread_parts(raw)
            return None if parts is None else b.Snapshot(raw.sequence, tuple(chunk_objects(parts, chunk_bytes)))

        query = q.snapshot_query(thread_id, turn_limit, before, children)
        return await self._store.read(query, decode, q.snapshot_read_class(turn_limit, before))

    async def thread_snapshot_json(self, thread_id: str, turn_limit: int, before: int | None, children: bool = False) -> orjson.Fragment | None:
        """The thread snapshot as one encoded JSON object (an RPC result)."""
        query = q.snapshot_query(thread_id, turn_limit, before, children)
        return await self._store.read(query, _fragment(b.thread_parts), q.snapshot_read_class(turn_limit, before))

    async def pending_requests_json(self, thread_id: str | None) -> orjson.Fragment:
        """Pending requests as an encoded JSON list, large fields summarized."""

        def decode(bodies: list[bytes]) -> orjson.Fragment:
            return orjson.Fragment(b"[" + b",".join(summarize_payload(body) for body in bodies) + b"]")

        return await self._store.read(q.pending_requests_query(thread_id), decode, ReadClass.SMALL)

    async def shell_pieces(self) -> list[bytes]:
        """The shell as one JSON object in pieces of at most 256 KiB (HTTP)."""
        if self._shell_rows is not None:
            shell = await self._shell_copy()
            made = self._thread_pieces  # the rows' pieces, made again only when a row changed
            if made is None or made[0] is not shell.threads:
                made = self._thread_pieces = (shell.threads, await thread_pieces(shell.threads))
            return [*_cut(_shell_head(shell)), *made[1], b"]}"]
        wave = self._shell_reads.join(None)
        if not self._share:
            pieces = await wave.result()
        else:
            async with self._one_shell_read:
                pieces = await wave.result()
        assert pieces is not None
        return pieces

    async def _shell_copy(self) -> ShellCopy:
        """The in-memory shell now, seeded first if it is not yet (one seed read at a time)."""
        rows = self._shell_rows
        assert rows is not None
        if not rows.seeded:
            async with self._seeding:
                if not rows.seeded:
                    rows.begin_seed()  # right before the read: commits from now on are merged
                    workspaces = self._workspaces()  # and workspace changes from now on are marked
                    try:
                        found = await self._store.read(_seed_query, lambda raw: _seed_of(raw, workspaces), ReadClass.SMALL)
                    except BaseException:
                        rows.abort_seed()
                        raise
                    rows.seed(found)
        return rows.copy()

    async def _read_shell_pieces(self, _key: None) -> list[bytes] | None:
        workspaces = self._workspaces()
        return await self._store.read(q.shell_query, _pieces(lambda raw: b.shell_parts(raw, workspaces)), ReadClass.SMALL)

    async def detail(self, table: str, entity_id: str, path: Path) -> orjson.Fragment | None:
        """The full value at ``path`` in a stored item or request (``table``: items, requests),
        encoded; None if there is no such row, KeyError if the path is not in it."""

        def decode(body: bytes | None) -> orjson.Fragment | None:
            if body is None:
                return None
            return orjson.Fragment(orjson.dumps(value_at(orjson.loads(body), path)))

        return await self._store.read(q.body_query(table, entity_id), decode, ReadClass.HISTORY)


def _seed_query(conn: apsw.Connection) -> tuple[q.ShellRaw, list[str]]:
    """A shell read, with its projects' ids (one read transaction)."""
    raw = q.shell_query(conn)
    return raw, [project_id for (project_id,) in conn.execute("SELECT id FROM projects ORDER BY rowid")]


def _seed_of(found: tuple[q.ShellRaw, list[str]], workspaces: Mapping[str, bytes]) -> Seed:
    raw, project_ids = found
    threads = ((tid, shell_payload(*row)) for tid, row in zip(raw.thread_ids, raw.threads, strict=True))
    return seed_of(raw.sequence, zip(project_ids, raw.projects, strict=True), threads, workspaces)


# Thread rows per piece of a shell response built from the in-memory shell: a large shell
# is built piece by piece with a checkpoint between pieces (each a join of this many rows,
# about 0.1 ms), so the loop runs other work meanwhile.
ROWS_PER_PIECE = 256


def _shell_head(shell: ShellCopy) -> bytes:
    return b'{"sequence":%d,"projects":[%s],"threads":[' % (shell.sequence, b",".join(shell.projects))


async def thread_pieces(threads: tuple[bytes, ...]) -> list[bytes]:
    """The shell's thread rows, comma-separated, in pieces of at most 256 KiB: a join of
    `ROWS_PER_PIECE` rows at a time, with a checkpoint between, letting the loop run."""
    pieces: list[bytes] = []
    for start in range(0, len(threads), ROWS_PER_PIECE):
        if start:
            await trio.lowlevel.checkpoint()
        pieces += _cut((b"," if start else b"") + b",".join(threads[start : start + ROWS_PER_PIECE]))
    return pieces


async def shell_copy_snapshot(shell: ShellCopy) -> b.Snapshot:
    """The subscribe.shell snapshot of the in-memory shell (the chunks `b.decode_shell_snapshot`
    makes of a read of the same state), with a checkpoint between chunks of a large one."""
    chunks = []
    for chunk in shell_chunks(shell, CHUNK_DATA_BYTES):
        chunks.append(chunk)
        if len(shell.threads) > ROWS_PER_PIECE:
            await trio.lowlevel.checkpoint()
    return b.Snapshot(shell.sequence, tuple(chunks))


def _cut(data: bytes, budget: int = CHUNK_BYTES) -> list[bytes]:
    if len(data) <= budget:
        return [data]
    return [data[at : at + budget] for at in range(0, len(data), budget)]


def _pieces(parts_of: Callable[[R], Parts | None]) -> Callable[[R], list[bytes] | None]:
    def decode(raw: R) -> list[bytes] | None:
        parts = parts_of(raw)
        return None if parts is None else object_pieces(parts)

    return decode


def _fragment(parts_of: Callable[[R], Parts | None]) -> Callable[[R], orjson.Fragment | None]:
    def decode(raw: R) -> orjson.Fragment | None:
        parts = parts_of(raw)
        return None if parts is None else orjson.Fragment(object_bytes(parts))

    return decode
