"""`ItemCoalescer`: streaming states merge while the writer is behind; final states are exact.

The coalescer runs on a real trio loop with its real flusher and ticker; what it commits
is recorded. ``writes`` is the `WritePipeline` of a real store, whose writer the test
holds busy to play one that is behind.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import attrs
import trio
import trio.testing

from t3d.domain import commands as c
from t3d.domain.model import TurnItem
from t3d.providers.coalesce import COALESCE_S, LATE_S, ItemCoalescer
from t3d.providers.pipeline import WritePipeline
from t3d.store.store import open_store


def _item(text: str, item_id: str = "t:1") -> TurnItem:
    return TurnItem(item_id, "th", "t", 0, "assistant_message", "streaming", None, text, None, 1.0)


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


async def test_states_merge_while_the_writer_is_behind_and_the_pace_returns_after(tmp_path: Path) -> None:
    """On a real store whose writer is held busy, 20 new states of an item sent while the
    update before has not committed become one update (the newest), committed once the
    writer is free; with commits quick again updates are spaced by COALESCE_S again. A
    commit through `commit` first records the newest pending state."""
    committed: list[str] = []
    release = threading.Event()
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", "/p"))
        await store.execute(c.CreateThread("th", "p", "replay"))
        await store.execute(c.StartTurn("th", "t", "go"))
        await store.record(c.MarkTurnRunning("t"))
        store.on_commit(lambda done: committed.extend(e.entity.text for e in done.events if e.kind == "item.updated"))
        pipeline = WritePipeline(store.send, store.record, lambda command, exc: None)
        items = ItemCoalescer(lambda turn_id, states: pipeline.write(c.RecordItems(turn_id, states)), pipeline)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(items.run)
            nursery.start_soon(store.maintain, lambda conn: release.wait(30))  # the writer is busy
            await trio.testing.wait_all_tasks_blocked()
            await items.stream(_item("a"))  # goes at once, and waits for the writer
            text = "a"
            for n in range(20):  # the writer is behind: these merge
                text += str(n % 10)
                await items.stream(_item(text))
                await trio.sleep(COALESCE_S / 2)
            release.set()
            await pipeline.settled()
            with trio.fail_after(10):
                while len(committed) < 2:  # noqa: ASYNC110 (the commit listener has no event)
                    await trio.sleep(0.01)
            await pipeline.drain()
            assert committed == ["a", text]  # one update for the 20 states: the newest
            start = trio.current_time()
            for _ in range(8):  # quick commits: the normal pace
                text += "x"
                await items.stream(_item(text))
                await trio.sleep(COALESCE_S / 4)
            elapsed = trio.current_time() - start
            await items.stream(_item(text + "!"))
            await items.commit(pipeline.drain)
            assert 2 <= len(committed) - 2 <= elapsed / COALESCE_S + 2
            assert committed[-1] == text + "!"  # pending first, in order, before the commit
            nursery.cancel_scope.cancel()


async def test_no_update_goes_out_sooner_than_the_interval_after_the_last() -> None:
    """States every 5 ms for 0.6 s give updates never closer than COALESCE_S (the shared
    ticker rounds deadlines up, never down), and the last state is recorded too."""
    times: list[float] = []
    texts: list[str] = []

    async def commit_items(turn_id: str, states: tuple[TurnItem, ...]) -> None:
        times.append(trio.current_time())
        texts.append(states[-1].text or "")

    items = ItemCoalescer(commit_items)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(items.run)
        for n in range(120):
            await items.stream(_item("x" * n))
            await trio.sleep(0.005)
        await trio.sleep(2 * COALESCE_S)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= 5 and min(gaps) >= COALESCE_S - 1e-6, gaps
    assert texts[-1] == "x" * 119


async def test_a_held_back_state_goes_out_after_its_interval_without_another_state() -> None:
    """A second state right after the first waits for a third; when none comes, the timer
    records it anyway: not before COALESCE_S after the first, and soon after that."""
    times: list[tuple[float, str]] = []

    async def commit_items(turn_id: str, states: tuple[TurnItem, ...]) -> None:
        times.append((trio.current_time(), states[-1].text or ""))

    items = ItemCoalescer(commit_items)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(items.run)
        await items.stream(_item("a"))
        await trio.sleep(0.01)
        await items.stream(_item("ab"))
        with trio.fail_after(5):
            while len(times) < 2:  # noqa: ASYNC110 (the recorded list is the test's own)
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    (first, _), (second, text) = times
    assert text == "ab"
    assert COALESCE_S - 1e-6 <= second - first <= COALESCE_S + LATE_S + 1.0


async def test_a_due_state_that_finds_a_commit_under_way_goes_out_after_it() -> None:
    """An item's first state (due at once) that arrives while another task's commit holds
    the coalescer's lock (a Codex session answers a request while its reader streams) is
    neither lost nor an error: the flusher records it once the commit is done."""
    recorded: list[str] = []
    in_commit = trio.Event()
    finish = trio.Event()

    async def commit_items(turn_id: str, states: tuple[TurnItem, ...]) -> None:
        recorded.extend(state.text or "" for state in states)

    async def slow_commit() -> None:
        in_commit.set()
        await finish.wait()
        recorded.append("commit")

    items = ItemCoalescer(commit_items)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(items.run)
        nursery.start_soon(items.commit, slow_commit)
        await in_commit.wait()
        await items.stream(_item("first", "t:2"))  # due at once, the lock is held
        assert recorded == []
        finish.set()
        with trio.fail_after(5):
            while len(recorded) < 2:  # noqa: ASYNC110 (the recorded list is the test's own)
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    assert recorded == ["commit", "first"]


async def test_pending_states_of_two_turns_are_each_recorded_in_their_own_turn() -> None:
    """States of a turn's item and of its subagent's item held back together go out in one
    flush as two records, each under the turn its item belongs to."""
    recorded: list[tuple[str, tuple[str, ...]]] = []

    async def commit_items(turn_id: str, states: tuple[TurnItem, ...]) -> None:
        recorded.append((turn_id, tuple(s.text or "" for s in states)))

    async def nothing() -> None:
        return None

    items = ItemCoalescer(commit_items)
    child = attrs.evolve(_item(""), id="sub:1:a", turn_id="sub:1")
    await items.stream(attrs.evolve(child, text="s"))  # each item's first state goes at once
    await items.stream(_item("a"))
    await items.stream(attrs.evolve(child, text="su"))  # held back: not due yet
    await items.stream(_item("ab"))
    await items.commit(nothing)  # flushes both held states first
    assert recorded == [("sub:1", ("s",)), ("t", ("a",)), ("sub:1", ("su",)), ("t", ("ab",))]
