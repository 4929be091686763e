"""Connection settings and the migration ladder (keyed on ``user_version``).

Each projection table keeps a few indexed columns for queries and the entity's
JSON in ``body`` (the same bytes as the event that wrote it). Thread shells
read `thread_counts`, which triggers keep current, never ``COUNT(*)``.

A new database is created with incremental auto-vacuum, so retention can hand freed
pages back to the file system in small steps; an older one needs a one-time VACUUM
first (`convert_small_database` does it at start-up for a small one).
"""

from __future__ import annotations

import logging

import apsw

log = logging.getLogger("t3d.store")

# Each setting with its reason (apsw's bestpractice, docs/architecture.md, Store; README "Durability").
WRITER_PRAGMAS = (
    "PRAGMA journal_mode=WAL",  # readers never block the writer, nor it them
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=5000",  # another process (ctl, a second daemon) may hold a lock briefly
    # SQLite's default, said out loud: after a commit leaves over 1,000 pages (~4 MiB) in
    # the WAL, that commit copies them into the database (PASSIVE: never waits on readers).
    # The daemon's store replaces it with the checkpointer's hook (checkpointer.py): the
    # commit still runs a checkpoint while they are quick, another thread while they are
    # slow, and every commit at the WAL's bound.
    "PRAGMA wal_autocheckpoint=1000",
    "PRAGMA journal_size_limit=67108864",  # cap the WAL file left after checkpoints at 64 MiB
)

# `T3D_SQLITE_SYNCHRONOUS`, applied by the store. full (the default): each COMMIT syncs the WAL, so a commit
# that returned survives a power loss; it costs one fsync per transaction, on the writer
# thread (never the loop), shared by every update of a batch. normal: the WAL is synced
# only at checkpoints; a power loss (not a crash of t3d: the OS still has the writes) can
# lose the last commits since the last checkpoint, never corrupt the file.
SYNCHRONOUS = ("full", "normal")
READER_PRAGMAS = (
    "PRAGMA busy_timeout=5000",
    "PRAGMA query_only=ON",  # a reader can never write, even by mistake
)

TERMINAL = "('completed','interrupted','failed','cancelled')"

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema
    f"""
    CREATE TABLE events (
        sequence INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        thread_id TEXT,
        entity_id TEXT NOT NULL,
        payload BLOB NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX events_by_thread ON events(thread_id, sequence);

    CREATE TABLE receipts (
        command_id TEXT PRIMARY KEY,
        ok INTEGER NOT NULL,
        result BLOB NOT NULL,
        created_at REAL NOT NULL
    );

    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        thread_id TEXT,
        kind TEXT NOT NULL,
        payload BLOB NOT NULL,
        created_at REAL NOT NULL,
        done_at REAL
    );
    CREATE INDEX outbox_pending ON outbox(id) WHERE done_at IS NULL;

    CREATE TABLE projects (
        id TEXT PRIMARY KEY,
        path TEXT NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX projects_by_path ON projects(path);

    CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        project_id TEXT NOT NULL,
        body BLOB NOT NULL
    );

    CREATE TABLE turns (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        status TEXT NOT NULL,
        body BLOB NOT NULL
    );
    CREATE UNIQUE INDEX turns_by_thread ON turns(thread_id, ordinal);
    CREATE INDEX turns_open ON turns(thread_id, ordinal) WHERE status NOT IN {TERMINAL};

    CREATE TABLE items (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX items_by_turn ON items(turn_id, ordinal);
    CREATE INDEX items_by_thread ON items(thread_id);

    CREATE TABLE requests (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        status TEXT NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX requests_by_turn ON requests(turn_id);
    CREATE INDEX requests_pending ON requests(thread_id) WHERE status = 'pending';

    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        status TEXT NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX sessions_by_thread ON sessions(thread_id);
    CREATE INDEX sessions_live ON sessions(id) WHERE status != 'exited';

    CREATE TABLE thread_counts (
        thread_id TEXT PRIMARY KEY,
        turns INTEGER NOT NULL DEFAULT 0,
        items INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE turn_counts (
        turn_id TEXT PRIMARY KEY,
        items INTEGER NOT NULL DEFAULT 0
    );
    CREATE TRIGGER count_turn_added AFTER INSERT ON turns BEGIN
        INSERT INTO thread_counts(thread_id, turns) VALUES (new.thread_id, 1)
        ON CONFLICT(thread_id) DO UPDATE SET turns = turns + 1;
    END;
    CREATE TRIGGER count_turn_removed AFTER DELETE ON turns BEGIN
        UPDATE thread_counts SET turns = turns - 1 WHERE thread_id = old.thread_id;
        DELETE FROM turn_counts WHERE turn_id = old.id;
    END;
    CREATE TRIGGER count_item_added AFTER INSERT ON items BEGIN
        INSERT INTO thread_counts(thread_id, items) VALUES (new.thread_id, 1)
        ON CONFLICT(thread_id) DO UPDATE SET items = items + 1;
        INSERT INTO turn_counts(turn_id, items) VALUES (new.turn_id, 1)
        ON CONFLICT(turn_id) DO UPDATE SET items = items + 1;
    END;
    CREATE TRIGGER count_item_removed AFTER DELETE ON items BEGIN
        UPDATE thread_counts SET items = items - 1 WHERE thread_id = old.thread_id;
        UPDATE turn_counts SET items = items - 1 WHERE turn_id = old.turn_id;
    END;
    """,
    # checkpoints: one row per turn's checkpoint (t3d/git)
    """
    CREATE TABLE checkpoints (
        id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        status TEXT NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX checkpoints_by_thread ON checkpoints(thread_id, ordinal);
    """,
    # pending requests of every thread in order (requests.pending, an approval bot's
    # poll) without a scan of every request ever made; holds only pending rows
    """
    CREATE INDEX requests_pending_in_order ON requests(status) WHERE status = 'pending';
    """,
    # 4: a receipt remembers what was asked (the method and params, hashed), so the same
    # command_id sent with other params is refused instead of replayed; NULL in receipts
    # written before this version (those replay as before)
    """
    ALTER TABLE receipts ADD COLUMN fingerprint BLOB;
    """,
    # 5: retention (t3d/store/retention.py). ``events_by_entity`` finds an entity's earlier
    # events (the ones a newer event supersedes); the rowid (sequence) ends each entry.
    # ``retention`` holds each class's cursor and the shell's pruned-through mark;
    # ``pruned_threads`` the highest pruned sequence of each thread (a resume from before it
    # gets a snapshot); ``purge_threads`` the deleted threads whose events are still to go.
    """
    CREATE INDEX events_by_entity ON events(kind, entity_id);
    CREATE TABLE retention (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE pruned_threads (thread_id TEXT PRIMARY KEY, through INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE purge_threads (thread_id TEXT PRIMARY KEY, through INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO purge_threads(thread_id, through)
        SELECT entity_id, max(sequence) FROM events WHERE kind = 'thread.deleted' GROUP BY entity_id;
    """,
    # 6: retention compacts the newest event of an entity once it is past its class's age
    # (its payload is its projection row; retention.py). The cursors go back to the start,
    # so the next pass walks the log once more: below the old cursors it finds nothing more
    # to delete, and compacts.
    """
    DELETE FROM retention WHERE name IN ('cursor.item', 'cursor.state');
    """,
    # 7: subagents are child threads: a thread's children (a parent turn's end closes its
    # subagents' turns; a snapshot lists them) are found by their parent, not by a scan
    """
    ALTER TABLE threads ADD COLUMN parent_thread_id TEXT;
    UPDATE threads SET parent_thread_id = json_extract(body, '$.parent_thread_id')
        WHERE json_extract(body, '$.parent_thread_id') IS NOT NULL;
    CREATE INDEX threads_by_parent ON threads(parent_thread_id) WHERE parent_thread_id IS NOT NULL;
    """,
)

# auto_vacuum modes as ``PRAGMA auto_vacuum`` reports them.
AUTO_VACUUM_NONE = 0
AUTO_VACUUM_INCREMENTAL = 2
# An existing database that predates incremental auto-vacuum is converted (a full VACUUM:
# it rewrites the file and holds the writer meanwhile) at start-up only up to this size,
# about a second's work; a larger one waits for `t3d ctl db vacuum` (README "Data lifecycle").
CONVERT_AT_START_BYTES = 64 * 1024 * 1024


def migrate(conn: apsw.Connection) -> int:
    """Bring the schema up to date; return the resulting version.

    A database newer than this build is refused rather than guessed at.
    """
    version = conn.execute("PRAGMA user_version").get
    assert isinstance(version, int)
    if version > len(MIGRATIONS):
        from t3d.errors import StoreError

        raise StoreError(
            f"the database schema is version {version}, newer than this t3d supports "
            f"({len(MIGRATIONS)}); upgrade t3d or point --state-dir at another directory"
        )
    if version == 0 and not _has_tables(conn):
        # An empty database takes this at once, or after a VACUUM of nothing once its header
        # is written (journal_mode=WAL writes it); see `convert_small_database` for others.
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        if auto_vacuum(conn) != AUTO_VACUUM_INCREMENTAL:
            conn.execute("VACUUM")
    for target in range(version + 1, len(MIGRATIONS) + 1):
        if target == 5 and version > 0:
            log.info("upgrading the database to schema version 5: indexing the event log by entity (once; about 3 s per million events)")
        with conn:
            conn.execute(MIGRATIONS[target - 1])
            conn.execute(f"PRAGMA user_version={target}")
    return len(MIGRATIONS)


def _has_tables(conn: apsw.Connection) -> bool:
    return any(True for _ in conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' LIMIT 1"))


def auto_vacuum(conn: apsw.Connection) -> int:
    mode = conn.execute("PRAGMA auto_vacuum").get
    assert isinstance(mode, int)
    return mode


def convert_small_database(conn: apsw.Connection) -> bool:
    """Give a database without incremental auto-vacuum its one-time VACUUM, if it is at most
    `CONVERT_AT_START_BYTES`; return whether it is (now) incremental. A larger one is left as
    it is, with a log line: the VACUUM rewrites the whole file (minutes for gigabytes, and as
    much free disk again) while holding every write, so it is the user's call
    (`t3d ctl db vacuum`). Until then freed pages are reused but the file never shrinks."""
    if auto_vacuum(conn) == AUTO_VACUUM_INCREMENTAL:
        return True
    size = int(conn.execute("PRAGMA page_count").get) * int(conn.execute("PRAGMA page_size").get)
    if size > CONVERT_AT_START_BYTES:
        log.warning(
            "the database (%d MiB) predates incremental auto-vacuum: space retention frees is reused "
            "but the file does not shrink; run `t3d ctl db vacuum` once, at a quiet time (it rewrites "
            "the file, holds writes meanwhile and needs as much free disk again)",
            size >> 20,
        )
        return False
    log.info("converting the database (%d MiB) to incremental auto-vacuum: a one-time VACUUM", size >> 20)
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    try:
        conn.execute("VACUUM")
    except apsw.BusyError:  # another connection reads it right now: try at the next start
        log.warning("the one-time VACUUM could not run (the database is in use); it runs at the next start")
    return auto_vacuum(conn) == AUTO_VACUUM_INCREMENTAL
