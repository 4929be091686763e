"""Provider session lifetime: idle processes are stopped and resumed on the next turn."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from harness import new_thread, open_client, run_turn, start_daemon


async def test_an_idle_provider_is_stopped_and_the_next_turn_resumes_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """After provider_idle_timeout with no turn the process exits; the next turn starts one with --resume."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", provider_idle_timeout=0.4)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            seen = client.record_events()
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            assert first.turn["status"] == "completed"
            exited = await client.wait_event(
                lambda d: d["kind"] == "session.updated" and d["entity"]["status"] == "exited"
            )
            first_session = exited["entity"]
            assert first_session["exit_code"] == 0, (
                "an idle stop is a clean stdin close, not a kill"
            )
            assert first_session["native_session_id"], "the session stays resumable"
            second = await run_turn(client, thread_id, "Now EDIT notes.txt")
            assert second.turn["status"] == "completed"
            sessions = [d["entity"] for d in seen + second.events if d["kind"] == "session.updated"]
            new = [s for s in sessions if s["id"] != first_session["id"]]
            assert new and new[-1]["native_session_id"] == first_session["native_session_id"]
        daemon.stop()


async def test_a_busy_provider_is_not_stopped_for_idleness(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The idle clock runs only between turns: a turn longer than the timeout keeps its process."""
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", provider_idle_timeout=0.2, replay_speed=1
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            outcome = await run_turn(
                client, thread_id, "Please READ notes.txt"
            )  # ~1.5 s at recorded speed
            assert outcome.turn["status"] == "completed"
            assert not [
                d
                for d in outcome.events
                if d["kind"] == "session.updated" and d["entity"]["status"] == "exited"
            ]
        daemon.stop()


async def test_archiving_a_thread_cancels_its_turn_and_stops_its_provider(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """thread.archive mid-turn: the turn is cancelled at once and the provider process exits."""
    monkeypatch.setenv("T3D_REPLAY_INTERRUPT_TIMEOUT", "60")  # the fake holds turn 4 open
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            seen = client.record_events()
            for prompt in (
                "Please READ notes.txt",
                "Now EDIT notes.txt",
                "Now run BASH to create a file",
            ):
                assert (await run_turn(client, thread_id, prompt)).turn["status"] == "completed"
            started = await client.call(
                "turn.start", thread_id=thread_id, text="COUNT to 200 slowly"
            )
            await client.wait_event(
                lambda d: (
                    d["kind"] == "item.updated"
                    and d["entity"]["kind"] == "assistant_message"
                    and d["entity"]["turn_id"] == started["turn_id"]
                )
            )
            await client.call("thread.archive", thread_id=thread_id)
            turn = await client.wait_event(
                lambda d: (
                    d["kind"] == "turn.updated"
                    and d["entity"]["id"] == started["turn_id"]
                    and d["entity"]["status"] != "running"
                )
            )
            assert (
                turn["entity"]["status"] == "cancelled" and turn["entity"]["reason"] == "archived"
            )
            exited = await client.wait_event(
                lambda d: d["kind"] == "session.updated" and d["entity"]["status"] == "exited"
            )
            pid = exited["entity"]["pid"]
            assert not await trio.to_thread.run_sync(Path(f"/proc/{pid}/cmdline").exists), (
                "the process is reaped"
            )
            assert [d for d in seen if d["kind"] == "thread.updated" and d["entity"]["archived_at"]]
        daemon.stop()
