"""The reader pool's classes: the pure scheduler (Hypothesis), and the pool on a real SQLite file."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import apsw
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from t3d.store import queries as q
from t3d.store.read_classes import (
    AGE_LIMIT,
    PRIORITY,
    ReadClass,
    ReadScheduler,
    Ticket,
    history_cap,
)
from t3d.store.readers import ReaderPool
from t3d.store.schema import WRITER_PRAGMAS, migrate

SMALL, PAGE, HISTORY = ReadClass.SMALL, ReadClass.PAGE, ReadClass.HISTORY

# --- the pure scheduler ------------------------------------------------------------------


def grant_all(scheduler: ReadScheduler) -> list[Ticket]:
    granted = []
    while (ticket := scheduler.grant()) is not None:
        granted.append(ticket)
    return granted


def test_history_holds_all_readers_but_one_and_a_pool_of_one_still_runs_history() -> None:
    assert [history_cap(n) for n in (1, 2, 4, 32)] == [1, 1, 3, 31]
    scheduler = ReadScheduler(4)
    history = [scheduler.arrive(HISTORY) for _ in range(6)]
    assert grant_all(scheduler) == history[:3]
    small = scheduler.arrive(SMALL)
    assert grant_all(scheduler) == [small]  # the reader history may not take
    lone = ReadScheduler(1)
    only = lone.arrive(HISTORY)
    assert grant_all(lone) == [only]


def test_a_free_reader_goes_to_small_then_page_then_history() -> None:
    scheduler = ReadScheduler(1)
    blocker = scheduler.arrive(PAGE)
    assert grant_all(scheduler) == [blocker]
    history, page, small = (scheduler.arrive(c) for c in (HISTORY, PAGE, SMALL))
    order = []
    scheduler.leave(blocker)
    for _ in range(3):
        (ticket,) = grant_all(scheduler)
        order.append(ticket)
        scheduler.leave(ticket)
    assert order == [small, page, history]


def test_a_history_read_under_a_flood_of_small_reads_goes_after_the_age_limit() -> None:
    """Aging: small reads keep arriving, yet the waiting history read gets the reader once
    `AGE_LIMIT` reads have been granted since it arrived."""
    scheduler = ReadScheduler(1)
    first = scheduler.arrive(SMALL)
    grant_all(scheduler)
    history = scheduler.arrive(HISTORY)
    running = first
    overtaken = 0
    while running is not history and overtaken <= 10 * AGE_LIMIT:
        scheduler.arrive(SMALL)
        scheduler.leave(running)
        (running,) = grant_all(scheduler)
        overtaken += running is not history
    assert overtaken == AGE_LIMIT


@given(st.integers(1, 8), st.lists(st.sampled_from(PRIORITY), max_size=60))
def test_every_read_runs_once_readers_keep_finishing(
    readers: int, classes: list[ReadClass]
) -> None:
    """Liveness: whatever arrives, finishing reads one by one serves every read exactly once."""
    scheduler = ReadScheduler(readers)
    tickets = [scheduler.arrive(c) for c in classes]
    served: list[Ticket] = grant_all(scheduler)
    running = list(served)
    while running:
        scheduler.leave(running.pop(0))
        new = grant_all(scheduler)
        served += new
        running += new
    assert sorted(t.arrival for t in served) == sorted(t.arrival for t in tickets)
    assert scheduler.waiting() == scheduler.running() == 0


class SchedulerMachine(RuleBasedStateMachine):
    """Arrivals, completions and give-ups in any order: bounds, work conservation and
    bounded overtaking hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: ReadScheduler | None = None
        self.waiting: list[Ticket] = []
        self.running: list[Ticket] = []
        self.overtaken: dict[int, int] = {}  # arrival -> later reads granted while it could run

    @rule(readers=st.integers(1, 6))
    @precondition(lambda self: self.scheduler is None)
    def open_pool(self, readers: int) -> None:
        self.scheduler = ReadScheduler(readers)

    def _dispatch(self) -> None:
        s = self.scheduler
        assert s is not None
        while True:
            could_run = [
                t
                for t in self.waiting
                if t.read_class is not HISTORY or s.running(HISTORY) < s.history_cap
            ]
            ticket = s.grant()
            if ticket is None:
                return
            for other in could_run:
                if other.arrival < ticket.arrival:
                    self.overtaken[other.arrival] += 1
            self.waiting.remove(ticket)
            self.running.append(ticket)

    @rule(read_class=st.sampled_from(PRIORITY))
    @precondition(lambda self: self.scheduler is not None)
    def arrive(self, read_class: ReadClass) -> None:
        s = self.scheduler
        assert s is not None
        nothing_else_small = not any(
            t.read_class is not HISTORY for t in self.running + self.waiting
        )
        ticket = s.arrive(read_class)
        self.overtaken[ticket.arrival] = 0
        self.waiting.append(ticket)
        self._dispatch()
        if read_class is SMALL and s.readers >= 2 and nothing_else_small:
            assert ticket.running, "a small read waited although only history held readers"

    @rule(data=st.data())
    @precondition(lambda self: self.running)
    def finish(self, data: st.DataObject) -> None:
        assert self.scheduler is not None
        ticket = data.draw(st.sampled_from(self.running))
        self.running.remove(ticket)
        self.scheduler.leave(ticket)
        self._dispatch()

    @rule(data=st.data())
    @precondition(lambda self: self.waiting)
    def give_up(self, data: st.DataObject) -> None:
        assert self.scheduler is not None
        ticket = data.draw(st.sampled_from(self.waiting))
        self.waiting.remove(ticket)
        self.scheduler.leave(ticket)
        self._dispatch()

    @invariant()
    def bounds_hold(self) -> None:
        s = self.scheduler
        if s is None:
            return
        assert s.running() == len(self.running) <= s.readers
        assert s.running(HISTORY) <= s.history_cap
        assert s.waiting() == len(self.waiting)

    @invariant()
    def work_conserving(self) -> None:
        s = self.scheduler
        if s is None or s.running() == s.readers:
            return
        for ticket in self.waiting:
            assert ticket.read_class is HISTORY and s.running(HISTORY) == s.history_cap, (
                f"a reader is free while a {ticket.read_class.value} read that may run waits"
            )

    @invariant()
    def no_starvation(self) -> None:
        assert all(n <= AGE_LIMIT for n in self.overtaken.values()), self.overtaken


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# --- the pool on a real database -------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> str:
    """An empty database with the real schema (made before the test's Trio run starts)."""
    path = tmp_path / "db"
    conn = apsw.Connection(str(path))
    for pragma in WRITER_PRAGMAS:
        conn.execute(pragma)
    migrate(conn)
    conn.close()
    return str(path)


class Started:
    """Names of the queries that started, in order; the loop can wait for a count."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()

    def note(self, name: str) -> None:  # on a reader thread
        trio.from_thread.run_sync(self._note, name, trio_token=self._token)

    def _note(self, name: str) -> None:
        self.names.append(name)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, count: int) -> None:
        while len(self.names) < count:
            await self._changed.wait()


def _held(release: threading.Event, started: Started, name: str) -> Any:
    """A query that reads, then holds its read transaction until ``release``."""

    def query(conn: apsw.Connection) -> int:
        conn.execute("SELECT count(*) FROM threads").fetchall()
        started.note(name)
        release.wait(10)
        return 0

    return query


def _ident(raw: Any) -> Any:
    return raw


async def test_a_small_read_is_served_while_history_reads_saturate_the_pool(database: str) -> None:
    """Six history reads on four readers: three run (history keeps one reader free), three
    wait, and a shell read completes while all of them are still held."""
    pool = ReaderPool(database, 4)
    release = threading.Event()
    started = Started()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(pool.read, _held(release, started, f"h{i}"), _ident, HISTORY)
                await started.wait_for(3)
                await trio.testing.wait_all_tasks_blocked()
                stats = pool.statistics()
                assert (stats.busy, stats.waiting_history, stats.waiting_small) == (3, 3, 0)
                shell = await pool.read(q.shell_query, q.decode_shell, SMALL)
                assert shell["threads"] == [] and len(started.names) == 3
                release.set()
        assert sorted(started.names) == [f"h{i}" for i in range(6)]
        assert pool.statistics().busy == 0
    finally:
        release.set()
        pool.close()


async def test_waiting_reads_run_small_first_and_report_their_class(database: str) -> None:
    """One reader, held: a history, a page and a small read queue up (visible per class in
    the statistics) and then run small, page, history."""
    pool = ReaderPool(database, 1)
    release = threading.Event()
    started = Started()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.read, _held(release, started, "blocker"), _ident, SMALL)
                await started.wait_for(1)
                for name, read_class in (("history", HISTORY), ("page", PAGE), ("small", SMALL)):
                    nursery.start_soon(pool.read, _held(release, started, name), _ident, read_class)
                    await trio.testing.wait_all_tasks_blocked()
                stats = pool.statistics()
                assert (stats.waiting_small, stats.waiting_page, stats.waiting_history) == (1, 1, 1)
                release.set()
        assert started.names == ["blocker", "small", "page", "history"]
    finally:
        pool.close()


async def test_a_read_cancelled_while_waiting_leaves_the_queue(database: str) -> None:
    """A waiting read that is cancelled is gone from the counts and takes no reader later."""
    pool = ReaderPool(database, 1)
    release = threading.Event()
    started = Started()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pool.read, _held(release, started, "blocker"), _ident, PAGE)
                await started.wait_for(1)
                with trio.move_on_after(0.05):
                    await pool.read(_held(release, started, "gave up"), _ident, HISTORY)
                assert pool.statistics().waiting_history == 0
                release.set()
            assert await pool.read(q.projects_query, q.decode_list, SMALL) == []
        assert started.names == ["blocker"]
        assert pool.statistics().busy == 0
    finally:
        release.set()
        pool.close()


@pytest.mark.parametrize(
    ("turn_limit", "before", "expected"),
    [(10, None, PAGE), (1, None, PAGE), (11, None, HISTORY), (10, 5, HISTORY)],
)
def test_a_snapshot_of_the_latest_turns_is_a_page_and_one_reaching_back_is_history(
    turn_limit: int, before: int | None, expected: ReadClass
) -> None:
    assert q.snapshot_read_class(turn_limit, before) is expected
