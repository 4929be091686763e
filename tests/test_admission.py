"""Admission with real parts: the gate on a lag trace (virtual time, real SQLite store),
the active-turn cap in a real daemon, held turns visible as queued, and a really
saturated loop reported by /api/health."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import orjson
import trio
import trio.lowlevel
import trio.testing
from harness import http, new_thread, open_client, run_turn, start_daemon, wait_until

from t3d.admission.core import SATURATED_STARTS
from t3d.admission.service import Admission
from t3d.ctl.listing import format_threads
from t3d.domain import commands as c
from t3d.domain.events import Effect, StartProviderTurn
from t3d.loop_monitor import LoopMonitor
from t3d.store.store import open_store

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error}")


def lag_trace(now: float) -> float:
    """Seconds of lag at virtual time ``now``: calm, saturated, in between, calm again."""
    if now < 3:
        return 0.005
    if now < 7:
        return 0.050
    if now < 9:
        return 0.035  # between 3/4 of the 40 ms mark and the mark: no change
    return 0.010


async def test_a_lag_trace_closes_the_gate_after_2_s_and_reopens_it_below_three_quarters(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    monitor = LoopMonitor()
    dispatched: list[Effect] = []

    async def hand_to_session(effect: Effect) -> None:
        dispatched.append(effect)

    # Virtual time must not run on while the writer thread commits (autojump would jump it
    # while the loop waits for the thread): it moves only while the trace plays.
    autojump_clock.autojump_threshold = math.inf
    async with open_store(tmp_path / "db", on_writer_lost=_lost) as store, trio.open_nursery() as nursery:
        admission = Admission(store, monitor, hand_to_session, mark_ms=40, max_active=0)
        store.on_commit(admission.on_commit)
        await store.execute(c.CreateProject("p", str(tmp_path)))
        for n in range(6):
            await store.execute(c.CreateThread(f"t{n}", "p", "replay"))

        t0 = trio.current_time()

        async def feed_lag() -> None:
            while True:
                monitor.record(trio.current_time(), lag_trace(trio.current_time() - t0))
                await trio.sleep(0.01)

        changes: list[tuple[float, bool]] = []

        async def watch_gate() -> None:
            state = False
            while True:
                if admission.gate.saturated != state:
                    state = admission.gate.saturated
                    changes.append((trio.current_time() - t0, state))
                await trio.sleep(0.01)

        nursery.start_soon(feed_lag)
        nursery.start_soon(watch_gate)
        await nursery.start(admission.run)
        autojump_clock.autojump_threshold = 0
        await trio.sleep(6)
        assert admission.gate.saturated
        # Six turns ready to start while saturated: four start, two are held, in order.
        # Virtual time stands still while they commit, however slow the disk is.
        autojump_clock.autojump_threshold = math.inf
        for n in range(6):
            await store.execute(c.StartTurn(f"t{n}", f"u{n}", "hello"))
            await admission.dispatch(StartProviderTurn(f"t{n}", f"u{n}", "hello"))
        assert [e.turn_id for e in dispatched] == [f"u{n}" for n in range(SATURATED_STARTS)]
        snapshot = await store.snapshot("t5")
        assert (snapshot["turns"][-1]["status"], snapshot["turns"][-1]["queue_reason"]) == ("queued", "loop_saturated")
        assert admission.statistics()["held_turns"] == 2
        autojump_clock.autojump_threshold = 0
        # The held two start once it reopens. Bounded in real time: while their commits run
        # on the writer thread, virtual time jumps on (a slow fsync on a cold disk let a
        # virtual 120 s pass in CI before they were committed).
        deadline = time.monotonic() + 60
        await wait_until(lambda: len(dispatched) == 6 or time.monotonic() > deadline)
        assert len(dispatched) == 6, f"the held turns never started: {dispatched}"
        nursery.cancel_scope.cancel()
    [(closed_at, closed), (opened_at, closed_again)] = changes
    assert closed and not closed_again
    # The gate moves on each 10 ms sample and the watcher looks every 10 ms: a few ticks of slack.
    assert 4.99 <= closed_at <= 5.05  # lag at the mark from 3.0 s, held for 2 s
    assert 9.99 <= opened_at <= 10.05  # the 35 ms readings left the 1 s window at 10.0 s
    assert [e.turn_id for e in dispatched] == [f"u{n}" for n in range(6)]


async def test_the_active_turn_cap_holds_under_concurrent_starts(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", max_active_turns=2)
        async with open_client(daemon) as client:
            threads = [await new_thread(client, tmp_path) for _ in range(6)]
            for thread_id in threads:
                await client.call("subscribe.thread", thread_id=thread_id)
            events = client.record_events()
            for thread_id in threads:  # back to back: each start is decided before the first runs
                await client.send_raw(orjson.dumps({"jsonrpc": "2.0", "id": thread_id, "method": "turn.start", "params": {"thread_id": thread_id, "text": READ}}).decode())
            while not _all_done(events, 6):
                await client.wait_event(lambda d: d["kind"] == "turn.updated")
    turns: dict[str, list[dict[str, Any]]] = {}
    running: set[str] = set()
    most = 0
    for event in sorted((e for e in events if e["kind"] == "turn.updated"), key=lambda e: e["sequence"]):
        turn = event["entity"]
        turns.setdefault(turn["id"], []).append(turn)
        if turn["status"] in ("running", "waiting"):
            running.add(turn["id"])
        else:
            running.discard(turn["id"])
        most = max(most, len(running))
    assert most <= 2, f"{most} turns ran at once under a cap of 2"
    assert len(turns) == 6 and all(history[-1]["status"] == "completed" for history in turns.values())
    held = [t for t, history in turns.items() if any(h.get("queue_reason") == "max_active_turns" for h in history)]
    assert len(held) >= 4  # six at once under a cap of two: at least four waited


def _all_done(events: list[dict[str, Any]], count: int) -> bool:
    done = {e["entity"]["id"] for e in events if e["kind"] == "turn.updated" and e["entity"]["status"] == "completed"}
    return len(done) >= count


async def test_a_held_turn_is_queued_with_its_reason_in_snapshots_and_ctl_threads(nursery: trio.Nursery, tmp_path: Path) -> None:
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", max_active_turns=1)
        async with open_client(daemon) as client:
            busy, waiting = await new_thread(client, tmp_path), await new_thread(client, tmp_path)
            await client.call("subscribe.thread", thread_id=busy)
            await run_turn(client, busy, READ)
            # Turn 2 of the recording asks for approval: it stays active until answered.
            await client.call("turn.start", thread_id=busy, text=EDIT)
            request = await client.wait_event(lambda d: d["kind"] == "request.updated")
            started = await client.call("turn.start", thread_id=waiting, text=READ)
            assert started["status"] == "starting"  # decided before admission held it

            async def held() -> bool:
                snapshot = await client.call("thread.snapshot", thread_id=waiting)
                return bool(snapshot["turns"][-1]["status"] == "queued")

            await wait_until(held)
            snapshot = await client.call("thread.snapshot", thread_id=waiting)
            assert snapshot["turns"][-1]["queue_reason"] == "max_active_turns"
            assert (snapshot["thread"]["status"], snapshot["thread"]["queue_reason"]) == ("queued", "max_active_turns")
            _, shell = await http(daemon, "GET", "/api/shell")
            table = format_threads(shell["threads"], {}, {}, 0.0)
            assert "queued (max_active_turns)" in table
            _, health = await http(daemon, "GET", "/api/health")
            assert health["admission"]["held_turns"] == 1 and health["admission"]["active_turns"] == 1

            await client.call("request.respond", request_id=request["entity"]["id"], decision="allow")
            await client.call("subscribe.thread", thread_id=waiting)
            await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == started["turn_id"] and d["entity"]["status"] == "completed"
            )


async def test_a_saturated_loop_shows_in_health_and_recovers(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The daemon shares this test's Trio run, so blocking this thread blocks its loop:
    real lag, over a 30 ms mark for more than 2 s."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", effect_admission_delay_ms=30)
        deadline = trio.current_time() + 3.5
        while trio.current_time() < deadline:
            time.sleep(0.045)  # noqa: ASYNC251  (the point: the loop is held)
            await trio.lowlevel.checkpoint()
        _, health = await http(daemon, "GET", "/api/health")
        assert health["admission"]["state"] == "saturated"
        assert health["status"] == "degraded"
        assert "the event loop is saturated; new turns are held back" in health["reasons"]
        assert health["loop_lag_ms"]["p99"] >= 30

        async def reopened() -> bool:
            _, health = await http(daemon, "GET", "/api/health")
            return bool(health["admission"]["state"] == "open")

        await wait_until(reopened, interval=0.2)
        _, health = await http(daemon, "GET", "/api/health")
        assert health["admission"]["saturated_s"] > 0
