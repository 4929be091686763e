"""Retention on a real SQLite file: what a pass deletes and compacts, against a model.

The model is the whole event log as committed, kept aside. An event is superseded by a
newer event of the same entity (kind and id); once a class's cursor reached H (the last
event older than the class's age at some pass), every event that an event at or below H
supersedes is gone, a ``thread.deleted`` at or below the state cursor is gone, and every
event of a deleted thread below its ``thread.deleted`` is gone. Nothing else is. An event
at or below H that was its entity's newest when a pass moved the cursor there is
compacted (its payload empty, its body its row) until it goes; nothing else is.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import attrs
import orjson
import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_domain_model import COMMANDS, PROJECTION_TABLES, SETUP

from t3d.domain import commands as c
from t3d.domain.codec import to_json
from t3d.domain.model import TurnItem
from t3d.domain.state import State, fold
from t3d.errors import DomainError
from t3d.store import queries as q
from t3d.store.commit import StoredEvent, execute
from t3d.store.packing import unpack
from t3d.store.pruner import Pruner
from t3d.store.queries import SnapshotRaw
from t3d.store.replay import ThreadReplayRaw, thread_resume_query
from t3d.store.retention import COMPACTED_COUNT, count_step, retention_value, run_step, survey
from t3d.store.retention_plan import (
    COMPACTED,
    ITEM,
    KINDS,
    STATE,
    Checkpoint,
    Outbox,
    Pass,
    Policy,
    Purge,
    StepResult,
    Survey,
    Vacuum,
    Window,
    last_before,
    next_span,
    pause_after,
)
from t3d.store.schema import MIGRATIONS, WRITER_PRAGMAS, migrate
from t3d.store.store import open_store

CLASS_OF = {kind: cls for cls, kinds in KINDS.items() for kind in kinds}
TABLE_OF = {
    "thread.updated": "threads", "turn.updated": "turns", "item.updated": "items",
    "request.updated": "requests", "session.updated": "sessions", "checkpoint.updated": "checkpoints",
}  # fmt: skip


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


# --- the model ---------------------------------------------------------------------------


def expected_retained(log: list[StoredEvent], cursors: dict[str, int], purged: dict[str, int]) -> set[int]:
    """Sequences that must still be stored, given the whole log, the classes' cursors and the
    deleted threads purged (thread id -> its thread.deleted sequence)."""
    gone: set[int] = set()
    by_entity: dict[tuple[str, str], list[int]] = {}
    for event in log:
        by_entity.setdefault((event.kind, event.entity.id), []).append(event.sequence)
    for (kind, _), sequences in by_entity.items():
        cls = CLASS_OF.get(kind)
        if cls is None:
            continue
        passed = [s for s in sequences if s <= cursors[cls]]
        if passed:
            gone.update(s for s in sequences if s < max(passed))
    for event in log:
        if event.kind == "thread.deleted" and event.sequence <= cursors[STATE]:
            gone.add(event.sequence)
        if event.thread_id in purged and event.sequence < purged[event.thread_id]:
            gone.add(event.sequence)
    return {e.sequence for e in log} - gone


def newly_compacted(log: list[StoredEvent], cursors: dict[str, int]) -> set[int]:
    """Sequences a pass that moved the cursors to ``cursors`` compacts (or found compacted):
    each entity's newest event, if at or below its class's cursor (no ``thread.deleted``)."""
    newest: dict[tuple[str, str], StoredEvent] = {}
    for event in log:
        newest[(event.kind, event.entity.id)] = event
    return {
        e.sequence
        for e in newest.values()
        if e.kind in CLASS_OF and e.kind != "thread.deleted" and e.sequence <= cursors[CLASS_OF[e.kind]]
    }


def stored_events(conn: apsw.Connection) -> tuple[set[int], set[int]]:
    """The stored sequences, and those of them compacted."""
    rows = [(int(s), bytes(p)) for s, p in conn.execute("SELECT sequence, payload FROM events")]
    return {s for s, _ in rows}, {s for s, p in rows if p == COMPACTED}


def projections(conn: apsw.Connection) -> dict[str, dict[str, Any]]:
    return {
        table: {orjson.loads(unpack(body))["id"]: orjson.loads(unpack(body)) for (body,) in conn.execute(f"SELECT body FROM {table}")}
        for table in PROJECTION_TABLES
    }


def folded(state: State) -> dict[str, dict[str, Any]]:
    return {table: {e.id: to_json(e) for e in getattr(state, table).values()} for table in PROJECTION_TABLES}


def prune_now(conn: apsw.Connection, now: float, policy: Policy) -> Pass:
    """One whole pass on ``conn``, as the pruner runs it (survey in a read, each step alone)."""
    with conn:
        found = survey(conn, now, policy)
    plan = Pass(found, policy)
    while (step := plan.next_step()) is not None:
        plan.finished(step, run_step(conn, step))
    return plan


AGES = st.sampled_from([0.0, 1.0, 3.0, 10.0, None])


class RetentionMachine(RuleBasedStateMachine):
    """Random commands (the domain model's), time passing, and passes with random ages."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.conn = apsw.Connection(str(Path(self.dir.name) / "t.sqlite"))
        for pragma in WRITER_PRAGMAS:
            self.conn.execute(pragma)
        self.conn.execute("PRAGMA synchronous=OFF")
        migrate(self.conn)
        self.now = 1000.0
        self.log: list[StoredEvent] = []
        self.cursors = {ITEM: 0, STATE: 0}
        self.purged: dict[str, int] = {}
        self.compacted: set[int] = set()

    def teardown(self) -> None:
        self.conn.close()
        self.dir.cleanup()

    def _execute(self, command: c.Command) -> None:
        try:
            committed = execute(self.conn, command, None, self.now)
        except DomainError:
            return
        self.log += committed.events

    @initialize()
    def setup(self) -> None:
        for command in SETUP:
            self._execute(command)

    @rule(make=COMMANDS)
    def command(self, make: Callable[[State], c.Command]) -> None:
        self._execute(make(fold(e_of(s) for s in self.log)))

    @rule(key=st.sampled_from(["a", "b", "c"]), times=st.integers(1, 4))
    def stream_an_item(self, key: str, times: int) -> None:
        """Snapshots of one item of an open turn, as a provider streams them."""
        state = fold(e_of(s) for s in self.log)
        running = [t for t in state.turns.values() if t.status in ("starting", "running", "waiting")]
        if not running:
            return
        turn = running[0]
        for n in range(times):
            item = TurnItem(f"s-{key}", turn.thread_id, turn.id, 0, "assistant_message", "streaming", None, "x" * (n + 1), None, self.now)
            self._execute(c.RecordItems(turn.id, (item,)))
            self.now += 0.5

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(item_age=AGES, state_age=AGES)
    def prune(self, item_age: float | None, state_age: float | None) -> None:
        policy = Policy(item_age_s=item_age, state_age_s=state_age, first_span=3, min_span=1, purge_rows=2, outbox_rows=2)
        for cls, age in ((ITEM, item_age), (STATE, state_age)):
            if age is not None:
                older = [e.sequence for e in self.log if e.created_at < self.now - age]
                self.cursors[cls] = max([self.cursors[cls], *older])
        for event in self.log:
            if event.kind == "thread.deleted":
                self.purged[event.entity.id] = max(self.purged.get(event.entity.id, 0), event.sequence)
        plan = prune_now(self.conn, self.now, policy)
        retained = expected_retained(self.log, self.cursors, self.purged)
        fresh = newly_compacted(self.log, self.cursors) & retained - self.compacted
        assert sum(plan.compacted.values()) == len(fresh)
        self.compacted = (self.compacted | fresh) & retained

    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        """A thread resume from any point: a replay is exactly the thread's events after it,
        whole (none compacted); from at or after the thread's mark (within the bounds) it is
        a replay, from before it a snapshot."""
        thread_id = data.draw(st.sampled_from(sorted({e.thread_id for e in self.log if e.thread_id})))
        top = self.log[-1].sequence
        after = data.draw(st.integers(0, top))
        marks = dict(self.conn.execute("SELECT thread_id, through FROM pruned_threads"))
        with self.conn:
            raw = thread_resume_query(thread_id, after, 50, 10_000, 1 << 30)(self.conn)
        exists = any(True for _ in self.conn.execute("SELECT 1 FROM threads WHERE id = ?", (thread_id,)))
        if exists and after >= marks.get(thread_id, 0):
            assert isinstance(raw, ThreadReplayRaw)
            assert raw.events == [(e.sequence, e.kind, e.payload) for e in self.log if e.thread_id == thread_id and e.sequence > after]
        else:
            assert isinstance(raw, SnapshotRaw)

    @invariant()
    def retained_are_exactly_the_unsuperseded(self) -> None:
        stored, _ = stored_events(self.conn)
        assert stored == expected_retained(self.log, self.cursors, self.purged)

    @invariant()
    def compacted_are_exactly_the_newest_passed(self) -> None:
        """Compacted: the events that were their entity's newest when a cursor passed them,
        as long as they stay; the count db.stats shows is theirs."""
        _, compacted = stored_events(self.conn)
        assert compacted == self.compacted
        assert retention_value(self.conn, COMPACTED_COUNT) == len(compacted)

    @invariant()
    def a_compacted_newest_events_body_is_its_row(self) -> None:
        """The body a compacted event dropped is its entity's row (while it is the newest)."""
        newest: dict[tuple[str, str], StoredEvent] = {}
        for event in self.log:
            newest[(event.kind, event.entity.id)] = event
        deleted = {e.entity.id for e in self.log if e.kind == "thread.deleted"}
        for event in newest.values():
            if event.sequence in self.compacted and event.thread_id not in deleted:
                table = TABLE_OF[event.kind]
                rows = list(self.conn.execute(f"SELECT body FROM {table} WHERE id = ?", (event.entity.id,)))
                assert [orjson.loads(b) for (b,) in rows] == [to_json(event.entity)]

    @invariant()
    def projections_are_the_final_state(self) -> None:
        assert projections(self.conn) == folded(fold(e_of(s) for s in self.log))

    @invariant()
    def each_thread_mark_is_its_highest_deleted_or_compacted_event(self) -> None:
        """The resume mark: a replay from at or after it misses nothing of the thread and
        meets no compacted event."""
        stored, compacted = stored_events(self.conn)
        marks = dict(self.conn.execute("SELECT thread_id, through FROM pruned_threads"))
        expected: dict[str, int] = {}
        for event in self.log:
            if (event.sequence not in stored or event.sequence in compacted) and event.thread_id is not None:
                expected[event.thread_id] = max(expected.get(event.thread_id, 0), event.sequence)
        assert marks == expected


def e_of(stored: StoredEvent) -> Any:
    from t3d.domain.events import Event

    return Event(stored.kind, stored.entity)  # type: ignore[arg-type]


TestRetentionMachine = RetentionMachine.TestCase
TestRetentionMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- the plan, pure -------------------------------------------------------------------------


def test_last_before_finds_the_last_event_older_than_a_time() -> None:
    """Over sequences with gaps and equal times, the binary search lands on the highest
    sequence whose time is before the bound, or on ``lo`` when none is."""
    events = [(2, 10.0), (3, 10.0), (7, 11.0), (8, 15.0), (20, 15.0), (21, 30.0)]

    def first_from(s: int) -> tuple[int, float] | None:
        return next(((q, t) for q, t in events if q >= s), None)

    assert last_before(first_from, 0, 21, 10.0) == 0
    assert last_before(first_from, 0, 21, 10.5) == 3
    assert last_before(first_from, 0, 21, 15.0) == 7
    assert last_before(first_from, 0, 21, 16.0) == 20
    assert last_before(first_from, 0, 21, 99.0) == 21
    assert last_before(first_from, 7, 21, 16.0) == 20
    assert last_before(first_from, 20, 21, 16.0) == 20


def test_a_window_span_follows_the_step_time_within_bounds() -> None:
    """A fast step doubles the span, a slow one shrinks it (at most to a quarter), never
    past the policy's bounds; the pause leaves the writer to others (duty 1/4: 3x the step)."""
    policy = Policy(target_step_s=0.01, min_span=64, max_span=1000)
    assert next_span(400, 0.001, policy) == 800
    assert next_span(400, 0.0, policy) == 800
    assert next_span(800, 0.001, policy) == 1000
    assert next_span(400, 0.02, policy) == 200
    assert next_span(400, 1.0, policy) == 100
    assert next_span(100, 1.0, policy) == 64
    assert pause_after(0.01, policy) == pytest.approx(0.03)


def test_vacuum_steps_shrink_when_moving_pages_is_slow_and_grow_back() -> None:
    """A vacuum step that took 14x the target (a 256-page step on the 4 M-event database
    took ~140 ms) is followed by ones a quarter the size until steps take about the target,
    never under the policy's floor; fast steps double it again, up to the ceiling."""
    policy = Policy(target_step_s=0.01, vacuum_pages=256, min_vacuum_pages=8, max_vacuum_pages=1024, vacuum_slack_pages=0)
    plan = Pass(Survey(0.0, {ITEM: 0, STATE: 0}, {ITEM: 0, STATE: 0}, (), True, 100_000), policy, outbox_done=True)
    sizes, free = [], 100_000
    for elapsed in (0.14, 0.14, 0.14, 0.14, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001):
        step = plan.next_step()
        assert isinstance(step, Vacuum)
        sizes.append(step.pages)
        free -= step.pages
        plan.finished(step, StepResult(free_pages=free, elapsed_s=elapsed))
    assert sizes == [256, 64, 16, 8, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_a_pass_purges_then_windows_then_outbox_vacuum_and_checkpoint() -> None:
    """Deleted threads first, then each class's windows up to its cutoff, the outbox until a
    step deletes nothing, vacuum while pages beyond the slack are free, one checkpoint. A dry
    run plans the same windows and the outbox count, nothing after."""
    survey_ = Survey(1000.0, {ITEM: 0, STATE: 5}, {ITEM: 25, STATE: 5}, (("t", 40, 3),), True, 300)
    policy = Policy(first_span=10, target_step_s=0.01, min_span=10, max_span=10, purge_rows=2, vacuum_pages=50, max_vacuum_pages=50, vacuum_slack_pages=100)
    plan = Pass(survey_, policy)
    seen = []
    results = {
        Purge: StepResult(rows=2, free_pages=300),
        Window: StepResult(rows=1, free_pages=300, elapsed_s=0.01),
        Outbox: StepResult(rows=0, free_pages=300),
    }
    free = 300
    while (step := plan.next_step()) is not None:
        seen.append(step)
        if isinstance(step, Vacuum):
            free -= step.pages
            plan.finished(step, StepResult(free_pages=free))
        elif isinstance(step, Purge) and len([s for s in seen if isinstance(s, Purge)]) == 2:
            plan.finished(step, StepResult(rows=1, free_pages=300))
        else:
            plan.finished(step, results.get(type(step), StepResult(free_pages=free)))
    assert seen == [
        Purge("t", 40, 2), Purge("t", 40, 2),
        Window(ITEM, 0, 10), Window(ITEM, 10, 20), Window(ITEM, 20, 25),
        Outbox(1000.0 - policy.state_age_s, policy.outbox_rows),  # type: ignore[operator]
        Vacuum(50), Vacuum(50), Vacuum(50), Vacuum(50),
        Checkpoint(),
    ]  # fmt: skip
    assert plan.cursors == {ITEM: 25, STATE: 5}
    assert plan.done == plan.total == 3 + 25 + 200

    dry = Pass(survey_, policy, dry_run=True)
    steps = []
    while (step := dry.next_step()) is not None:
        steps.append(type(step))
        dry.finished(step, StepResult(rows=1))
    assert steps == [Window, Window, Window, Outbox]
    assert dry.rows["deleted threads"] == 3


# --- on the real store, under concurrent writes ---------------------------------------------


async def test_pruning_while_sessions_write_loses_nothing(tmp_path: Path) -> None:
    """Passes with both ages 0 run back to back while 6 sessions stream items and finish
    turns, and one thread is deleted: afterwards (one last pass) every entity's newest event
    is stored and nothing else but never-superseded kinds, the deleted thread's events are
    gone but its thread.deleted, every stored event but the projects' is compacted, and the
    projections equal the fold of everything committed."""
    published: list[StoredEvent] = []
    with trio.fail_after(120):
        async with open_store(tmp_path / "t3d.sqlite", on_writer_lost=_lost) as store:
            store.on_commit(lambda done: published.extend(done.events))
            pruner = Pruner(store, Policy(item_age_s=0.0, state_age_s=0.0, first_span=50))
            store.on_commit(pruner.on_commit)
            await store.execute(c.CreateProject("p", "/p"))
            for n in range(6):
                await store.execute(c.CreateThread(f"t{n}", "p", "replay"))
            writing = True

            async def session(n: int) -> None:
                for turn in range(4):
                    turn_id = f"u{n}-{turn}"
                    await store.execute(c.StartTurn(f"t{n}", turn_id, "go"))
                    await store.record(c.MarkTurnRunning(turn_id))
                    for step in range(30):
                        item = TurnItem(f"{turn_id}:a", f"t{n}", turn_id, 0, "assistant_message", "streaming", None, "x" * step, None, 0.0)
                        await store.record(c.RecordItems(turn_id, (item,)))
                    await store.record(c.FinishTurn(turn_id, "completed"))
                    if n == 5 and turn == 1:
                        await store.execute(c.DeleteThread("t5"))
                        return

            async def prune() -> None:
                while writing:
                    await pruner.run_pass()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(prune)
                async with trio.open_nursery() as sessions:
                    for n in range(6):
                        sessions.start_soon(session, n)
                writing = False
            await pruner.run_pass()
            assert pruner.passes > 2

            def read(conn: apsw.Connection) -> tuple[set[int], set[int], int, dict[str, dict[str, Any]]]:
                return (*stored_events(conn), retention_value(conn, COMPACTED_COUNT), projections(conn))

            stored, compacted, counted, tables = await store.read(read, lambda raw: raw)
    newest: dict[tuple[str, str], StoredEvent] = {}
    for event in published:
        newest[(event.kind, event.entity.id)] = event
    expected = {e.sequence for e in published if e.kind == "project.updated"} | {
        e.sequence for e in newest.values() if e.kind in CLASS_OF and e.kind != "thread.deleted" and e.thread_id != "t5"
    }
    assert stored == expected, "the newest event of every entity, and nothing else"
    assert compacted == expected - {e.sequence for e in published if e.kind == "project.updated"}, "every newest one of a class compacted"
    assert counted == len(compacted)
    assert tables == folded(fold(e_of(e) for e in published))




def _connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    for pragma in WRITER_PRAGMAS:
        conn.execute(pragma)
    migrate(conn)
    return conn


def test_the_newest_outbox_row_stays_so_effect_ids_keep_growing(tmp_path: Path) -> None:
    """Done outbox rows older than the state age go, but never the newest: outbox ids are
    rowids and the effect worker takes each new one to be higher than any before."""
    conn = _connect(tmp_path / "t.sqlite")
    with conn:
        for n in range(5):
            conn.execute("INSERT INTO outbox(thread_id, kind, payload, created_at, done_at) VALUES ('t', 'X', x'', ?, ?)", (n, n))
    prune_now(conn, 100.0, Policy(item_age_s=None, state_age_s=0.0, outbox_rows=2))
    assert [i for (i,) in conn.execute("SELECT id FROM outbox")] == [5]
    conn.execute("INSERT INTO outbox(thread_id, kind, payload, created_at) VALUES ('t', 'X', x'', 101)")
    assert conn.last_insert_rowid() == 6
    conn.close()


def test_a_pass_leaves_the_wal_truncated_and_gives_pages_back(tmp_path: Path) -> None:
    """After a pass that deleted thousands of snapshots and compacted the last, incremental
    vacuum has handed the free pages back (at most the slack stays free) and the WAL file is empty again."""
    path = tmp_path / "t.sqlite"
    conn = _connect(path)
    for command in SETUP:
        execute(conn, command, None, 1.0)
    execute(conn, c.StartTurn("t-a", "u", "go"), None, 1.0)
    execute(conn, c.MarkTurnRunning("u"), None, 1.0)
    for n in range(3000):
        item = TurnItem("u:a", "t-a", "u", 0, "assistant_message", "streaming", None, "x" * (1000 + n), None, 1.0)
        execute(conn, c.RecordItems("u", (item,)), None, 1.0 + n / 1000)
    size = path.stat().st_size
    assert conn.execute("PRAGMA auto_vacuum").get == 2
    plan = prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=None, vacuum_slack_pages=16))
    assert plan.rows["item snapshots"] == 2999
    assert conn.execute("SELECT length(payload) FROM events WHERE entity_id = 'u:a'").fetchall() == [(0,)]
    assert plan.compacted_bytes["item snapshots"] > 4000
    assert conn.execute("PRAGMA freelist_count").get <= 16
    assert path.stat().st_size < size / 4
    assert Path(f"{path}-wal").stat().st_size == 0
    conn.close()


def test_compaction_gives_the_log_pages_back(tmp_path: Path) -> None:
    """2,000 items written once each (1.5 KB, inside their table pages; nothing superseded):
    a pass compacts them all, and the pages their payloads filled go back to the file, not
    left as scattered free space in the log's old pages (which nothing new would reuse):
    the file ends at under two thirds of its size; the items' rows are stored packed, each
    still whole (its JSON as it was)."""
    path = tmp_path / "t.sqlite"
    conn = _connect(path)
    for command in (*SETUP, c.StartTurn("t-a", "u", "go"), c.MarkTurnRunning("u")):
        execute(conn, command, None, 1.0)
    items = [TurnItem(f"u:{n}", "t-a", "u", n, "assistant_message", "completed", None, f"{n} " + "x" * 1500, None, 1.0) for n in range(2000)]
    for n in range(0, 2000, 50):
        execute(conn, c.RecordItems("u", tuple(items[n : n + 50])), None, 2.0)
    pages = conn.execute("PRAGMA page_count").get
    plan = prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=None, vacuum_slack_pages=16))
    assert plan.compacted["item snapshots"] >= 2000 and plan.rows["item snapshots"] == 0
    assert conn.execute("PRAGMA page_count").get < pages * 2 / 3
    assert plan.packed == 2000 and plan.packed_bytes > 2000 * 1000
    stored = [bytes(b) for (b,) in conn.execute("SELECT body FROM items WHERE id != 'u:user' ORDER BY ordinal")]
    assert all(len(b) < 200 for b in stored)  # packed
    assert [orjson.loads(unpack(b))["text"] for b in stored] == [i.text for i in items]
    conn.close()


def test_packed_items_read_as_before_and_take_updates(tmp_path: Path) -> None:
    """After a pass packs a turn's items, the thread's snapshot and an item's stored JSON
    (what item.detail reads) are what they were before; an item too small to pay for packing
    stays plain; a packed item's next update is read through its packed row and stored
    plain again; a dry run counts what it would pack and changes nothing."""
    conn = _connect(tmp_path / "t.sqlite")
    for command in (*SETUP, c.StartTurn("t-a", "u", "go"), c.MarkTurnRunning("u")):
        execute(conn, command, None, 1.0)
    words = " ".join(f"word{n % 97}" for n in range(400))
    items = [TurnItem(f"u:{n}", "t-a", "u", n + 1, "tool_call", "completed", "Read", None, {"input": {"n": n}, "result": words}, 1.0) for n in range(30)]
    small = TurnItem("u:small", "t-a", "u", 99, "assistant_message", "completed", None, "ok", None, 1.0)
    execute(conn, c.RecordItems("u", (*items, small)), None, 2.0)

    def read() -> tuple[Any, bytes | None]:
        with conn:
            snapshot = q.decode_snapshot(q.snapshot_query("t-a", 10, None)(conn))
            return snapshot, q.body_query("items", "u:7")(conn)

    before = read()
    dry = prune_now_dry(conn, 100.0, Policy(item_age_s=0.0, state_age_s=None))
    assert dry.packed == 30 and dry.packed_bytes > 30 * 1000 and read() == before
    plan = prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=None))
    assert plan.packed == 30 and plan.packed_bytes == dry.packed_bytes
    stored = dict(conn.execute("SELECT id, body FROM items").fetchall())
    assert stored["u:small"][:1] == b"{" and all(stored[i.id][:1] != b"{" for i in items)
    assert read() == before

    execute(conn, c.RecordItems("u", (attrs.evolve(items[7], title="Read again", updated_at=3.0),)), None, 3.0)
    body = conn.execute("SELECT body FROM items WHERE id = 'u:7'").get
    assert body[:1] == b"{" and orjson.loads(body)["title"] == "Read again"
    conn.close()


def prune_now_dry(conn: apsw.Connection, now: float, policy: Policy) -> Pass:
    """A dry pass on ``conn``, as ``db.prune --dry-run`` runs it (each step a read)."""
    with conn:
        found = survey(conn, now, policy)
        plan = Pass(found, policy, dry_run=True)
        while (step := plan.next_step()) is not None:
            plan.finished(step, count_step(conn, step))
    return plan


def test_retention_settings_take_durations_within_their_ranges() -> None:
    """Ages and the interval read seconds or a unit (s, m, h, d); out of range or not a
    duration stops start-up naming the setting and what is allowed; off turns retention off."""
    from t3d.config import load_settings
    from t3d.errors import ConfigError

    settings = load_settings(
        {"retention_item_snapshots_age": "5m", "retention_interval": "90"},
        {"T3D_RETENTION_STATE_EVENTS_AGE": "2d", "T3D_RETENTION": "off"},
    )
    assert (settings.retention_item_snapshots_age, settings.retention_state_events_age) == (300.0, 172800.0)
    assert (settings.retention_interval, settings.retention) == (90.0, "off")
    assert load_settings({}, {"T3D_RETENTION_DUTY": "1"}).retention_duty == 1.0
    defaults = load_settings({}, {})
    assert (defaults.retention, defaults.retention_item_snapshots_age, defaults.retention_state_events_age, defaults.retention_interval, defaults.retention_duty) == ("on", 3600.0, 604800.0, 60.0, 0.25)
    for flag, raw, message in (
        ("retention_item_snapshots_age", "31d", "--retention-item-snapshots-age='31d' is out of range; use a duration from 0s to 30d"),
        ("retention_interval", "0", "--retention-interval='0' is out of range; use a duration from 1s to 1d"),
        ("retention_state_events_age", "soon", "--retention-state-events-age='soon' is not a duration"),
        ("retention_state_events_age", "nan", "out of range"),
        ("retention", "maybe", "--retention='maybe' is not allowed; use one of on, off"),
        ("retention_duty", "0", "--retention-duty='0' is out of range"),
    ):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_settings({flag: raw}, {})


def _resume(conn: apsw.Connection, thread_id: str, after: int) -> ThreadReplayRaw | SnapshotRaw:
    with conn:
        return thread_resume_query(thread_id, after, 50, 10_000, 1 << 30)(conn)  # type: ignore[no-any-return]


def test_a_resume_from_before_a_compacted_event_gets_a_snapshot(tmp_path: Path) -> None:
    """Compacted events are not only ever older than the deleted ones (a turn's final
    ``turn.updated`` is newer than every snapshot it superseded), so a compaction raises the
    thread's mark too: a resume from between the newest deleted and the newest compacted
    event gets a snapshot; one from the newest compacted event on gets a replay of whole
    events. The rows keep the final state."""
    conn = _connect(tmp_path / "t.sqlite")
    log: list[StoredEvent] = []
    for command in (*SETUP, c.StartTurn("t-a", "u", "go"), c.MarkTurnRunning("u")):
        log += execute(conn, command, None, 1.0).events
    for n in range(3):
        item = TurnItem("u:a", "t-a", "u", 0, "assistant_message", "streaming", None, "x" * (n + 1), None, 1.0)
        log += execute(conn, c.RecordItems("u", (item,)), None, 2.0 + n).events
    log += execute(conn, c.FinishTurn("u", "completed"), None, 6.0).events
    prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=0.0))
    stored, compacted = stored_events(conn)
    mine = [e.sequence for e in log if e.thread_id == "t-a"]
    deleted = max(s for s in mine if s not in stored)
    newest_compacted = max(s for s in mine if s in compacted)
    assert newest_compacted > deleted, "the case the marks of deletions alone would miss"
    assert conn.execute("SELECT through FROM pruned_threads WHERE thread_id = 't-a'").get == newest_compacted
    for after in range(deleted, newest_compacted):
        assert isinstance(_resume(conn, "t-a", after), SnapshotRaw), after
    renamed = execute(conn, c.RenameThread("t-a", "later"), None, 200.0).events
    replay = _resume(conn, "t-a", newest_compacted)
    assert isinstance(replay, ThreadReplayRaw)
    assert replay.events == [(e.sequence, e.kind, e.payload) for e in renamed]
    assert projections(conn) == folded(fold(e_of(e) for e in log + list(renamed)))
    conn.close()


def test_migration_6_lets_the_next_pass_compact_what_earlier_passes_pruned(tmp_path: Path) -> None:
    """A database pruned before compaction existed (schema 5: superseded events gone, the
    cursors at the top, every newest event whole): opened by this t3d, its cursors start
    over, and the next pass deletes nothing more and compacts every entity's newest event."""
    path = tmp_path / "t.sqlite"
    conn = _connect(path)
    log: list[StoredEvent] = []
    for command in (*SETUP, c.StartTurn("t-a", "u", "go"), c.MarkTurnRunning("u"), c.FinishTurn("u", "completed")):
        log += execute(conn, command, None, 1.0).events
    prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=0.0))
    with conn:  # as schema 5's retention left it: nothing compacted
        conn.executemany("UPDATE events SET payload = ? WHERE sequence = ?", [(e.payload, e.sequence) for e in log])
        conn.execute("DELETE FROM retention WHERE name = ?", (COMPACTED_COUNT,))
        conn.execute("DROP INDEX threads_by_parent")  # what schema 7 adds
        conn.execute("ALTER TABLE threads DROP COLUMN parent_thread_id")
        conn.execute("PRAGMA user_version=5")
    pruned, none = stored_events(conn)
    assert not none and retention_value(conn, "cursor.state") == log[-1].sequence
    conn.close()
    conn = _connect(path)
    assert conn.execute("PRAGMA user_version").get == len(MIGRATIONS)
    assert list(conn.execute("SELECT name FROM retention WHERE name LIKE 'cursor.%'")) == []
    plan = prune_now(conn, 100.0, Policy(item_age_s=0.0, state_age_s=0.0))
    stored, compacted = stored_events(conn)
    assert stored == pruned and not any(plan.rows.values())
    assert compacted == newly_compacted(log, {ITEM: log[-1].sequence, STATE: log[-1].sequence}) & stored
    assert len(compacted) == sum(plan.compacted.values()) == retention_value(conn, COMPACTED_COUNT) > 0
    conn.close()


async def test_the_events_deleted_count_leaves_out_the_outbox_rows_a_pass_removes(tmp_path: Path) -> None:
    """A pass that deletes superseded events and done outbox rows: health's and /metrics'
    ``deleted`` (`t3d_retention_events_deleted_total`) counts the events only, while the
    pass's report lists the outbox rows under their own phase."""
    with trio.fail_after(60):
        async with open_store(tmp_path / "t3d.sqlite", on_writer_lost=_lost) as store:
            pruner = Pruner(store, Policy(item_age_s=0.0, state_age_s=0.0))
            await store.execute(c.CreateProject("p", "/p"))
            await store.execute(c.CreateThread("t", "p", "replay"))
            for turn in range(3):
                turn_id = f"u{turn}"
                await store.execute(c.StartTurn("t", turn_id, "go"))
                await store.record(c.MarkTurnRunning(turn_id))
                for step in range(5):
                    item = TurnItem(f"{turn_id}:a", "t", turn_id, 0, "assistant_message", "streaming", None, "x" * step, None, 0.0)
                    await store.record(c.RecordItems(turn_id, (item,)))
                await store.record(c.FinishTurn(turn_id, "completed"))
            await store.mark_effects_done([effect_id for effect_id, _ in await store.pending_effects()])
            await trio.sleep(0.01)  # everything above is older than the ages of 0
            report = await pruner.run_pass()
    assert report.rows["outbox"] > 0
    events = sum(n for phase, n in report.rows.items() if phase != "outbox")
    assert events > 0
    assert pruner.statistics()["deleted"] == events
