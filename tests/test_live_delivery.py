"""Live delivery on a real daemon (tests/harness.py): slow subscribers, resume after a gap.

Turns run through the replay provider as real subprocesses; clients are real
WebSocket clients; what a client should hold is read back from the real
SQLite file. Each test states the behaviour it pins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from harness import FIXTURES, TERMINAL, new_thread, open_client, run_turn, start_daemon
from live_support import (
    merge_chunks,
    notes_until,
    raw_notes,
    thread_events,
    write_flood_fixture,
    ws_client,
)

from t3d.live.chunks import CHUNK_BYTES

ONE_TURN_FIXTURE = FIXTURES / "claude-2.1.197_oneshot_default_noprompttool.stdout.jsonl"
FLOOD_ITEMS = 1200


def position_of(notes: list[dict[str, Any]]) -> int:
    """Where a client stands after ``notes``: the last sequence it holds."""
    return max(n["seq"] for n in notes)


def turn_ended(turn_id: str) -> Any:
    return lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in TERMINAL


def apply(state: dict[str, Any], notes: list[dict[str, Any]]) -> dict[str, Any]:
    """A client's view (entity key -> entity) after a base or events."""
    chunks = [n for n in notes if n["kind"] == "snapshot.chunk"]
    if chunks:
        snap = merge_chunks(chunks)
        state = {f"thread:{snap['thread']['id']}": snap["thread"]}
        for name, kind in (("turns", "turn"), ("items", "item"), ("requests", "request")):
            state.update({f"{kind}:{e['id']}": e for e in snap[name]})
    for note in notes:
        if note["kind"] == "event":
            data = note["data"]
            state[f"{data['kind'].split('.')[0]}:{data['entity']['id']}"] = data["entity"]
    return state


def view_of_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    state = {f"thread:{snapshot['thread']['id']}": snapshot["thread"]}
    for name, kind in (("turns", "turn"), ("items", "item"), ("requests", "request")):
        state.update({f"{kind}:{e['id']}": e for e in snapshot[name]})
    return state


def without_sessions_and_settled(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in state.items()
        if not k.startswith("session:") and not (k.startswith("request:") and v["status"] != "pending")
    }


# --- one fast, one slow ---------------------------------------------------------------------


async def test_two_subscribers_of_one_thread_one_slow(tmp_path: Path, nursery: trio.Nursery) -> None:
    """While a turn commits 1,200 items, one subscriber reads everything and another reads
    nothing: the fast one receives every event of the turn, in order, with no resync, and has
    the turn's end before the slow one has read a single frame; the slow one then gets at most
    a buffer of stale events, ``resync``, a fresh snapshot and live events, and ends holding
    exactly what thread.snapshot holds."""
    with trio.fail_after(60):
        fixture = tmp_path / "flood.stdout.jsonl"
        write_flood_fixture(fixture, FLOOD_ITEMS)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with (
            open_client(daemon) as actor,
            open_client(daemon) as fast,
            ws_client(daemon, receive_buffer=4096) as slow,
        ):
            thread_id = await new_thread(actor, tmp_path)
            fast_sub = (await fast.call("subscribe.thread", thread_id=thread_id))["sub"]
            slow_sub = (await slow.call("subscribe.thread", thread_id=thread_id))["sub"]
            fast_base = await notes_until(fast, fast_sub, "snapshot.end")
            turn_id = (await actor.call("turn.start", thread_id=thread_id, text="flood"))["turn_id"]

            seen = fast.record_events()
            await fast.wait_event(turn_ended(turn_id))
            assert not [n for n in fast.notifications if n["kind"] == "resync"]
            events = await thread_events(daemon.settings.db_path, thread_id)
            after_base = [e for e in events if e["sequence"] > position_of(fast_base)]
            assert seen == after_base[: len(seen)] and seen[-1]["entity"]["id"] == turn_id
            assert sum(e["kind"] == "item.updated" for e in seen) >= FLOOD_ITEMS

            # Only now does the slow client read.
            notes = await notes_until(slow, slow_sub, "resync")
            end = next(i for i, n in enumerate(notes) if n["kind"] == "snapshot.end")
            assert len(notes[end + 1 : -1]) <= 1000
            fresh = await notes_until(slow, slow_sub, "snapshot.end")
            await actor.call("thread.rename", thread_id=thread_id, title="after the flood")
            live = await notes_until(slow, slow_sub, "event")
            assert live[-1]["data"]["entity"]["title"] == "after the flood"
            assert live[-1]["seq"] > fresh[-1]["seq"]
            final = await actor.call("thread.snapshot", thread_id=thread_id)
            held = apply(apply({}, fresh), live)
            assert without_sessions_and_settled(held) == without_sessions_and_settled(view_of_snapshot(final))
        daemon.stop()


# --- resume --------------------------------------------------------------------------------


async def test_resume_replays_a_small_gap_exactly_once(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A subscriber that left after turn 1 and comes back after turn 2 with after_sequence
    gets ``base: replay``: exactly the thread's events after its position (the completed turn
    and its final assistant message among them), each once, then ``synced``, then live events
    newer than the replay; the same for the shell (touched threads' rows, then ``synced``)."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(ONE_TURN_FIXTURE))
        async with open_client(daemon) as actor:
            thread_id = await new_thread(actor, tmp_path)
            async with open_client(daemon) as watcher, open_client(daemon) as shell_watcher:
                sub = (await watcher.call("subscribe.thread", thread_id=thread_id))["sub"]
                shell_sub = (await shell_watcher.call("subscribe.shell"))["sub"]
                shell_position = position_of(await notes_until(shell_watcher, shell_sub, "snapshot.end"))
                first = await run_turn(actor, thread_id, "turn 1")
                held = await notes_until(watcher, sub, "snapshot.end")
                seen = watcher.record_events()
                await watcher.wait_event(turn_ended(first.turn["id"]))
                position = max(position_of(held), seen[-1]["sequence"])

            second = await run_turn(actor, thread_id, "turn 2")  # while the watcher is away
            await actor.call("thread.rename", thread_id=thread_id, title="renamed while away")

            async with open_client(daemon) as back:
                result = await back.call("subscribe.thread", thread_id=thread_id, after_sequence=position)
                assert result["base"] == "replay"
                notes = await notes_until(back, result["sub"], "synced")
                replayed = [n["data"] for n in notes[:-1]]
                expected = [e for e in await thread_events(daemon.settings.db_path, thread_id) if e["sequence"] > position]
                assert replayed == expected
                assert notes[-1]["data"] == {"sequence": result["sequence"], "replayed": len(expected)}
                assert any(e["kind"] == "turn.updated" and e["entity"]["id"] == second.turn["id"] and e["entity"]["status"] == "completed" for e in replayed)
                final_answer = second.assistant_text[-1]
                assert any(e["kind"] == "item.updated" and e["entity"].get("text") == final_answer for e in replayed)

                await actor.call("thread.rename", thread_id=thread_id, title="back")
                live = await notes_until(back, result["sub"], "event")
                assert [n["data"]["entity"]["title"] for n in live] == ["back"]
                assert live[0]["seq"] > result["sequence"]

                shell = await back.call("subscribe.shell", after_sequence=shell_position)
                assert shell["base"] == "replay"
                shell_notes = await notes_until(back, shell["sub"], "synced")
                rows = [n["data"] for n in shell_notes if n["kind"] == "event"]
                assert rows and all(r["sequence"] > shell_position for r in rows)
                assert [r["sequence"] for r in rows] == sorted(r["sequence"] for r in rows)
                assert rows[-1]["kind"] == "shell.updated" and rows[-1]["entity"]["turn_count"] == 2
        daemon.stop()


async def test_resume_after_a_large_gap_gets_a_fresh_snapshot(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A subscriber away while a turn commits 1,200 items comes back with after_sequence and
    gets ``base: snapshot`` instead of a replay: chunks of at most 256 KiB holding the
    completed turn with every final item, then live events; a shell subscriber away for more
    than 128 shell-moving events gets a fresh shell snapshot too. An after_sequence from the
    future also gets a snapshot."""
    with trio.fail_after(60):
        fixture = tmp_path / "flood.stdout.jsonl"
        write_flood_fixture(fixture, FLOOD_ITEMS)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with open_client(daemon) as actor:
            thread_id = await new_thread(actor, tmp_path)
            async with open_client(daemon) as watcher:
                sub = (await watcher.call("subscribe.thread", thread_id=thread_id))["sub"]
                position = position_of(await notes_until(watcher, sub, "snapshot.end"))
                shell = await watcher.call("subscribe.shell")
                shell_position = shell["sequence"]

            outcome = await run_turn(actor, thread_id, "flood")
            for n in range(130):
                await actor.call("thread.rename", thread_id=thread_id, title=f"title {n}")

            async with ws_client(daemon) as back:
                result = await back.call("subscribe.thread", thread_id=thread_id, after_sequence=position)
                assert result["base"] == "snapshot"
                sized = await raw_notes(back, result["sub"], "snapshot.end")
                assert len(sized) > 2 and all(size <= CHUNK_BYTES for size, _ in sized)
                snapshot = merge_chunks([n for _, n in sized])
                assert snapshot["turns"][-1]["id"] == outcome.turn["id"]
                assert snapshot["turns"][-1]["status"] == "completed"
                assert [i for i in snapshot["items"] if i["turn_id"] == outcome.turn["id"]] == outcome.items

                shell_back = await back.call("subscribe.shell", after_sequence=shell_position)
                assert shell_back["base"] == "snapshot"
                shell_notes = await notes_until(back, shell_back["sub"], "snapshot.end")
                assert merge_chunks(shell_notes)["threads"][0]["title"] == "title 129"

                future = await back.call("subscribe.thread", thread_id=thread_id, after_sequence=result["sequence"] + 10_000)
                assert future["base"] == "snapshot"
        daemon.stop()
