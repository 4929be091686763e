"""Provider write batching on a real SQLite file (seed 001, issue 6 point 1).

The writer is held busy by a blocking job so that updates queue up behind it;
when it is released, what was queued commits in shared transactions.
"""

from __future__ import annotations

import gc
import itertools
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import apsw
import orjson
import outcome
import pytest
import trio
import trio.testing
from harness import start_daemon
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_domain_model import COMMANDS, PROJECTION_TABLES, SETUP

from t3d.cli import _exit_status, _leaf
from t3d.domain import commands as c
from t3d.domain.codec import event_from, to_json
from t3d.domain.model import TurnItem
from t3d.domain.state import State, fold
from t3d.errors import DomainError, StoreError, WriterLostError
from t3d.providers.pipeline import WritePipeline
from t3d.store.commit import Committed, Write, execute, execute_batch
from t3d.store.schema import WRITER_PRAGMAS, migrate
from t3d.store.store import BATCH_JOBS, Store, open_store
from t3d.store.writer import WriterThread

THREADS = 12


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


def _item(turn: str, key: str, text: str = "hello") -> TurnItem:
    return TurnItem(f"{turn}-{key}", f"t-{turn}", turn, 0, "assistant_message", "streaming", None, text, None, 0.0)


@asynccontextmanager
async def _running_turns(tmp_path: Path, *, batching: bool = True, commit_interval_s: float = 0.0) -> AsyncIterator[Store]:
    """A store with THREADS threads, each with a running turn ``u<n>``."""
    async with open_store(tmp_path / "db", batching=batching, commit_interval_s=commit_interval_s, on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", str(tmp_path)))
        for n in range(THREADS):
            await store.execute(c.CreateThread(f"t-u{n}", "p", "replay"))
            await store.execute(c.StartTurn(f"t-u{n}", f"u{n}", "go"))
            await store.execute(c.MarkTurnRunning(f"u{n}"))
        yield store


async def _behind_busy_writer(store: Store, commands: list[c.Command]) -> list[Any]:
    """Queue ``commands`` (in this order) while the writer is busy, then release it;
    returns each command's Committed or the exception it raised."""
    release = threading.Event()
    outcomes: list[Any] = [None] * len(commands)

    async def record(n: int, command: c.Command) -> None:
        try:
            outcomes[n] = await store.record(command)
        except Exception as exc:
            outcomes[n] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(store._writer.run, lambda conn: release.wait(10))  # type: ignore[attr-defined]
        await trio.testing.wait_all_tasks_blocked()
        for n, command in enumerate(commands):
            nursery.start_soon(record, n, command)
            await trio.testing.wait_all_tasks_blocked()  # queued in this order
        release.set()
    return outcomes


def _batches(store: Store) -> tuple[int, int]:
    stats = store.statistics()
    return stats.writer_batches_done, stats.writer_largest_batch


async def test_updates_queued_together_share_one_transaction_and_publish_in_order(tmp_path: Path) -> None:
    """Twelve sessions' updates queued behind a busy writer commit as ONE batch; every
    update is stored and published, in sequence order."""
    async with _running_turns(tmp_path) as store:
        published: list[int] = []
        store.on_commit(lambda done: published.extend(e.sequence for e in done.events))
        before, _ = _batches(store)
        outcomes = await _behind_busy_writer(store, [c.RecordItems(f"u{n}", (_item(f"u{n}", "a"),)) for n in range(THREADS)])
        assert all(isinstance(o, Committed) for o in outcomes)
        assert _batches(store) == (before + 1, THREADS)
        assert published == sorted(published) and len(published) == THREADS
        for n in range(THREADS):
            snapshot = await store.snapshot(f"t-u{n}")
            assert [i["text"] for i in snapshot["items"] if i["kind"] == "assistant_message"] == ["hello"]


async def test_an_isolated_update_commits_alone_and_at_once(tmp_path: Path) -> None:
    """Nothing queued behind it: the update is its own batch of one (no waiting for company)."""
    async with _running_turns(tmp_path) as store:
        before, _ = _batches(store)
        await store.record(c.RecordItems("u0", (_item("u0", "a"),)))
        await store.record(c.RecordItems("u1", (_item("u1", "a"),)))
        assert _batches(store) == (before + 2, 1)


async def test_under_load_updates_sent_one_by_one_share_a_transaction_per_commit_interval(tmp_path: Path) -> None:
    """--provider-commit-interval-ms: updates sent one at a time (never queued together)
    right after a commit join one transaction that stays open for the interval, each
    applied as it comes; they commit together, and none is done before the last was sent."""
    with trio.fail_after(20):
        async with _running_turns(tmp_path, commit_interval_s=1.0) as store:
            await (await store.send(c.RecordItems("u0", (_item("u0", "a"),)))).outcome()
            before, _ = _batches(store)
            pending = []
            for n in (1, 2, 3):
                pending.append(await store.send(c.RecordItems(f"u{n}", (_item(f"u{n}", "a"),))))
                await trio.sleep(0.05)
            assert not any(p.done for p in pending)
            results = [await p.outcome() for p in pending]
            assert _batches(store)[0] == before + 1
            sequences = [r.events[0].sequence for r in results]
            assert sequences == sorted(sequences)


async def test_an_update_after_a_quiet_spell_and_a_clients_command_never_wait_for_the_interval(tmp_path: Path) -> None:
    """With a 30 s commit interval: the first update after a quiet spell commits at once; the
    next one opens a transaction that waits for company, and a client's command arriving
    meanwhile joins it and commits it at once, after the update (in sequence order)."""
    with trio.fail_after(10):
        async with _running_turns(tmp_path, commit_interval_s=30.0) as store:
            await (await store.send(c.RecordItems("u0", (_item("u0", "a"),)))).outcome()
            before, _ = _batches(store)
            waiting = await store.send(c.RecordItems("u1", (_item("u1", "a"),)))
            await trio.sleep(0.2)
            assert not waiting.done
            project = await store.execute(c.CreateProject("p2", str(tmp_path / "p2")), command_id="c-1")
            update = await waiting.outcome()
            assert update.events[0].sequence < project.events[0].sequence
            assert _batches(store) == (before + 1, 2)
            assert (await store.execute(c.CreateProject("p2", str(tmp_path / "p2")), command_id="c-1")).result == project.result


async def test_the_outboxs_done_marks_join_an_open_transaction_and_commit_it(tmp_path: Path) -> None:
    """With a 30 s commit interval, an update that waits for company: marking outbox effects
    done (`mark_effects_done`, `finish_effect`) joins its transaction and commits it at once,
    the update included: one COMMIT for both, not a batch cut short and a second one."""
    with trio.fail_after(10):
        async with _running_turns(tmp_path, commit_interval_s=30.0) as store:
            effects = await store.pending_effects()
            assert len(effects) >= 2
            await (await store.send(c.RecordItems("u0", (_item("u0", "a"),)))).outcome()
            for n, (effect_id, effect) in enumerate(effects[:2]):  # each update waits for company
                before, _ = _batches(store)
                waiting = await store.send(c.RecordItems(f"u{n + 1}", (_item(f"u{n + 1}", "a"),)))
                await trio.sleep(0.2)
                assert not waiting.done
                if n == 0:
                    await store.mark_effects_done([effect_id])
                else:
                    await store.finish_effect(effect)
                await waiting.outcome()
                assert _batches(store) == (before + 1, 2)
            assert [i for i, _ in await store.pending_effects()] == [i for i, _ in effects[2:]]


async def test_batching_off_commits_each_update_alone(tmp_path: Path) -> None:
    """T3D_PROVIDER_COMMIT_BATCHING=false: the same queue commits one transaction per update."""
    async with _running_turns(tmp_path, batching=False) as store:
        before, _ = _batches(store)
        await _behind_busy_writer(store, [c.RecordItems(f"u{n}", (_item(f"u{n}", "a"),)) for n in range(THREADS)])
        assert _batches(store) == (before + THREADS, 1)


async def test_a_transaction_holds_at_most_64_updates_and_an_oversized_one_runs_alone(tmp_path: Path) -> None:
    """70 small updates: 64 + 6. Around a 2 MiB update: [small, small], [big], [small]."""
    async with _running_turns(tmp_path) as store:
        before, _ = _batches(store)
        await _behind_busy_writer(store, [c.RecordItems(f"u{n % THREADS}", (_item(f"u{n % THREADS}", f"k{n}"),)) for n in range(70)])
        assert _batches(store) == (before + 2, BATCH_JOBS)

        sizes: list[int] = []
        store.on_commit(lambda done: sizes.append(len(done.events)))
        big = "x" * (2 << 20)
        commands = [
            c.RecordItems("u0", (_item("u0", "s1"),)),
            c.RecordItems("u1", (_item("u1", "s2"),)),
            c.RecordItems("u2", (_item("u2", "big", big),)),
            c.RecordItems("u3", (_item("u3", "s3"),)),
        ]
        before, _ = _batches(store)
        outcomes = await _behind_busy_writer(store, commands)
        assert all(isinstance(o, Committed) for o in outcomes)
        assert _batches(store)[0] == before + 3


async def test_a_bad_update_rolls_back_only_itself_and_keeps_its_error(tmp_path: Path) -> None:
    """In a shared batch, an update the domain rejects fails with its own DomainError; its
    neighbours commit and publish; the bad one leaves no row and no publication."""
    async with _running_turns(tmp_path) as store:
        published: list[str] = []
        store.on_commit(lambda done: published.extend(e.entity.id for e in done.events))
        before, _ = _batches(store)
        commands: list[c.Command] = [
            c.RecordItems("u0", (_item("u0", "a"),)),
            c.RecordItems("no-such-turn", (_item("no-such-turn", "a"),)),
            c.RecordItems("u1", (_item("u1", "a"),)),
        ]
        first, bad, third = await _behind_busy_writer(store, commands)
        assert _batches(store) == (before + 1, 3)
        assert isinstance(first, Committed) and isinstance(third, Committed)
        assert isinstance(bad, DomainError) and "no-such-turn" in str(bad)
        assert published == ["u0-a", "u1-a"]


async def test_a_half_written_update_rolls_back_to_its_savepoint(tmp_path: Path) -> None:
    """An update whose second item fails to insert (a trigger aborts it) takes back its
    first item too, keeps its own SQLite error, and its batch neighbours commit."""
    async with _running_turns(tmp_path) as store:

        def refuse(conn: apsw.Connection) -> None:
            conn.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN new.entity_id = 'u1-second' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
            )

        await store._writer.run(refuse)  # type: ignore[attr-defined]
        outcomes = await _behind_busy_writer(
            store,
            [
                c.RecordItems("u0", (_item("u0", "a"),)),
                c.RecordItems("u1", (_item("u1", "first"), _item("u1", "second"))),
                c.RecordItems("u2", (_item("u2", "a"),)),
            ],
        )
        assert isinstance(outcomes[0], Committed) and isinstance(outcomes[2], Committed)
        assert isinstance(outcomes[1], apsw.ConstraintError) and "refused by the test" in str(outcomes[1])
        items = (await store.snapshot("t-u1"))["items"]
        assert [i["id"] for i in items if i["kind"] == "assistant_message"] == []


async def test_a_failed_commit_fails_every_update_of_the_batch(tmp_path: Path) -> None:
    """A COMMIT that fails (a deferred constraint) fails all three updates with a StoreError
    that says so; none is stored or published; the writer then goes on committing."""
    async with _running_turns(tmp_path) as store:

        def poison(conn: apsw.Connection) -> None:
            conn.execute(
                "CREATE TABLE parent(id TEXT PRIMARY KEY);"
                "CREATE TABLE guard(p TEXT REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);"
                "CREATE TRIGGER poison AFTER INSERT ON events WHEN new.entity_id = 'u1-poison' "
                "BEGIN INSERT INTO guard VALUES ('missing'); END;"
            )

        await store._writer.run(poison)  # type: ignore[attr-defined]
        published: list[int] = []
        store.on_commit(lambda done: published.extend(e.sequence for e in done.events))
        outcomes = await _behind_busy_writer(
            store,
            [
                c.RecordItems("u0", (_item("u0", "a"),)),
                c.RecordItems("u1", (_item("u1", "poison"),)),
                c.RecordItems("u2", (_item("u2", "a"),)),
            ],
        )
        for outcome in outcomes:
            assert isinstance(outcome, StoreError), outcome
            assert "transaction of 3 batched writes failed" in str(outcome)
            assert "FOREIGN KEY" in str(outcome.__cause__) or "constraint" in str(outcome.__cause__).lower()
        assert published == []
        for n in range(3):
            assert [i for i in (await store.snapshot(f"t-u{n}"))["items"] if i["kind"] == "assistant_message"] == []
        assert isinstance(await store.record(c.RecordItems("u0", (_item("u0", "b"),))), Committed)


async def test_a_turn_end_is_a_barrier_after_every_earlier_update(tmp_path: Path) -> None:
    """[items a, items b, end of a, items b2] queued together: the end commits alone,
    after a's and b's updates and before b2, in the order they were sent."""
    async with _running_turns(tmp_path) as store:
        kinds: list[tuple[str, int]] = []
        store.on_commit(lambda done: kinds.extend((e.kind, e.sequence) for e in done.events))
        before, _ = _batches(store)
        await _behind_busy_writer(
            store,
            [
                c.RecordItems("u0", (_item("u0", "a"),)),
                c.RecordItems("u1", (_item("u1", "a"),)),
                c.FinishTurn("u0", "completed"),
                c.RecordItems("u1", (_item("u1", "b"),)),
            ],
        )
        assert _batches(store)[0] == before + 2  # [a, b] then [b2]; the end ran on its own
        sequences = [s for _, s in kinds]
        assert sequences == sorted(sequences)
        order = [k for k, _ in kinds if k in ("item.updated", "turn.updated")]
        assert order == ["item.updated", "item.updated", "turn.updated", "item.updated"], kinds


async def test_a_publication_that_fails_fails_only_its_own_write(tmp_path: Path) -> None:
    """A commit listener that raises for one update: that caller gets a StoreError, the
    loop and the other updates go on."""
    async with _running_turns(tmp_path) as store:

        def picky(done: Committed) -> None:
            if any(e.entity.id == "u1-bad" for e in done.events):
                raise ValueError("cannot encode this one")

        store.on_commit(picky)
        outcomes = await _behind_busy_writer(
            store, [c.RecordItems(f"u{n}", (_item(f"u{n}", "bad" if n == 1 else "ok"),)) for n in range(3)]
        )
        assert isinstance(outcomes[0], Committed) and isinstance(outcomes[2], Committed)
        assert isinstance(outcomes[1], StoreError) and "could not be delivered" in str(outcomes[1])


async def test_a_lost_writer_thread_ends_the_daemon_with_writer_lost(tmp_path: Path) -> None:
    """If the writer thread dies (here: it is handed something that is not a job, as a bug
    would), run_daemon ends with WriterLostError, which the CLI turns into exit status 1
    so systemd restarts the daemon, instead of serving on without a database."""
    with pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            daemon = await start_daemon(nursery, tmp_path / "state")
            [writer] = [w for w in gc.get_objects() if isinstance(w, WriterThread) and w._thread.is_alive()]
            writer._queue.put("not a job")
            with trio.fail_after(10):
                await trio.sleep_forever()
    assert daemon.info.port  # it was serving before
    lost = _leaf(raised.value)
    assert isinstance(lost, WriterLostError) and "database writer thread died" in str(lost)
    assert _exit_status(lost) == 1


async def test_the_write_benchmark_stores_every_update_in_both_configurations() -> None:
    """`python -m bench writes` measures real work: every update of a small workload is
    stored with batching on and off, and on shares transactions where off cannot."""
    from bench.writes import Workload, run_one

    workload = Workload("tiny", streams=8, updates=5, interval_s=0.0, controls_every=3)
    on = await run_one(workload, batching=True, seed=1)
    off = await run_one(workload, batching=False, seed=1)
    for result in (on, off):
        assert result["stored"] == result["published"] == result["updates"] == 40
    assert off["transactions"] >= 40 and off["largest_batch"] == 1


class BatchMachine(RuleBasedStateMachine):
    """Random commands go to two real SQLite files: one by one through `execute` on one,
    in random batches through `execute_batch` on the other, sometimes with a COMMIT that
    fails. Invariants: both hold the same event log and projections (a batch commits what
    the same commands commit alone, and a failed batch commits nothing), each command's
    outcome is the same either way, and the batched file's projections equal the fold of
    its event log."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.single = self._connect("single")
        self.batched = self._connect("batched")
        # A deferred constraint that only COMMIT checks: armed, it fails the batch's COMMIT.
        self.batched.execute(
            "CREATE TABLE parent(id TEXT PRIMARY KEY);"
            "CREATE TABLE guard(p TEXT REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);"
        )
        self.clock = itertools.count(1)

    def _connect(self, name: str) -> apsw.Connection:
        conn = apsw.Connection(str(Path(self.dir.name) / f"{name}.sqlite"))
        for pragma in WRITER_PRAGMAS:
            conn.execute(pragma)
        migrate(conn)
        return conn

    def teardown(self) -> None:
        self.single.close()
        self.batched.close()
        self.dir.cleanup()

    @initialize()
    def a_project_and_two_threads(self) -> None:
        self.run_batch(lambda _state: list(SETUP), fail_commit=False)  # type: ignore[arg-type]

    @rule(
        makes=st.lists(COMMANDS, min_size=1, max_size=6),
        fail_commit=st.booleans(),
    )
    def a_batch(self, makes: list[Callable[[State], c.Command]], fail_commit: bool) -> None:
        self.run_batch(lambda state: [make(state) for make in makes], fail_commit)

    def run_batch(self, make: Callable[[State], list[c.Command]], fail_commit: bool) -> None:
        writes = [Write(command, None, float(next(self.clock))) for command in make(self._fold(self.batched))]
        if fail_commit:
            self.batched.execute(
                "CREATE TEMP TRIGGER poison AFTER INSERT ON events BEGIN INSERT INTO guard VALUES ('none'); END"
            )
            before = self._log(self.batched)
            try:
                execute_batch(self.batched, writes)
            except apsw.ConstraintError:
                pass  # something was written, so COMMIT failed: nothing may remain
            finally:
                self.batched.execute("DROP TRIGGER poison")
            assert self._log(self.batched) == before, "a failed COMMIT commits nothing"
            return
        batched = execute_batch(self.batched, writes)
        for write, result in zip(writes, batched, strict=True):
            alone = outcome.capture(execute, self.single, write.command, None, write.now)
            assert _shape(result) == _shape(alone), f"{write.command!r}: batched {result!r}, alone {alone!r}"

    @staticmethod
    def _log(conn: apsw.Connection) -> list[tuple[str, bytes]]:
        return list(conn.execute("SELECT kind, payload FROM events ORDER BY sequence"))

    @staticmethod
    def _fold(conn: apsw.Connection) -> State:
        return fold(event_from(k, p) for k, p in conn.execute("SELECT kind, payload FROM events ORDER BY sequence"))

    @invariant()
    def both_files_hold_the_same_log_and_projections(self) -> None:
        assert self._log(self.batched) == self._log(self.single)
        for table in PROJECTION_TABLES:
            query = f"SELECT body FROM {table} ORDER BY id"
            assert list(self.batched.execute(query)) == list(self.single.execute(query)), table
        expected = self._fold(self.batched)
        for table in PROJECTION_TABLES:
            rows = {orjson.loads(b)["id"]: orjson.loads(b) for (b,) in self.batched.execute(f"SELECT body FROM {table}")}
            assert rows == {e.id: to_json(e) for e in getattr(expected, table).values()}, table


def _shape(result: outcome.Outcome[Committed]) -> Any:
    """What a caller sees: the result and events, or the error's type and message."""
    if isinstance(result, outcome.Value):
        return result.value.result, [(e.kind, e.payload) for e in result.value.events]
    return type(result.error).__name__, str(result.error)


TestBatchMachine = BatchMachine.TestCase
TestBatchMachine.settings = settings(
    max_examples=25, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


async def test_one_sessions_burst_shares_transactions_through_its_pipeline(tmp_path: Path) -> None:
    """A session writing through its WritePipeline: a burst of 40 updates of one stream
    commits in far fewer than 40 transactions, all in order; a rejected update is reported
    and the stream goes on; a turn's end waits for every update before it."""
    async with _running_turns(tmp_path) as store:
        rejected: list[str] = []
        pipeline = WritePipeline(store.send, store.record, lambda command, error: rejected.append(str(error)), depth=16)
        sequences: list[tuple[str, int]] = []
        store.on_commit(lambda done: sequences.extend((e.entity.id, e.sequence) for e in done.events))
        before, _ = _batches(store)
        for k in range(40):
            if k == 20:
                await pipeline.write(c.RecordItems("no-such-turn", (_item("no-such-turn", "x"),)))
            await pipeline.write(c.RecordItems("u0", (_item("u0", f"k{k:02d}"),)))
        await pipeline.write(c.FinishTurn("u0", "completed"))
        batches = _batches(store)[0] - before
        assert batches < 20, f"{batches} transactions for a 41-update burst"
        assert rejected and "no-such-turn" in rejected[0]
        ids = [i for i, _ in sequences if i.startswith("u0-k")]
        assert ids == [f"u0-k{k:02d}" for k in range(40)], "the store saw the stream in order"
        last_item = max(n for n, (i, _) in enumerate(sequences) if i.startswith("u0-k"))
        turn_end = max(n for n, (i, _) in enumerate(sequences) if i == "u0")
        assert turn_end > last_item, "the turn's end came after every update"
        snapshot = await store.snapshot("t-u0")
        assert snapshot["turns"][-1]["status"] == "completed"
        assert len([i for i in snapshot["items"] if i["kind"] == "assistant_message"]) == 40


async def test_a_sessions_pipeline_queues_a_full_batch_while_one_commits(tmp_path: Path) -> None:
    """At the default depth one session hands over two full batches without waiting for a
    commit: 128 updates queued behind a busy writer commit as 64 + 64, not in halves."""
    async with _running_turns(tmp_path) as store:
        pipeline = WritePipeline(store.send, store.record, lambda command, error: pytest.fail(str(error)))
        release = threading.Event()
        before, _ = _batches(store)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._writer.run, lambda conn: release.wait(10))  # type: ignore[attr-defined]
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(5):  # a depth below 2 x BATCH_JOBS would wait on the busy writer
                for k in range(2 * BATCH_JOBS):
                    await pipeline.write(c.RecordItems("u0", (_item("u0", f"k{k:03d}"),)))
            release.set()
        await pipeline.drain()
        assert _batches(store) == (before + 2, BATCH_JOBS)
