"""A thread's queue of turns: edited, moved and cancelled before they start (turn.edit,
turn.move, turn.cancel), through a real daemon and the fake CLI, whose host log shows the
prompts that really reached the agent and in which order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from harness import RpcFailed, new_thread, open_client, run_turn, start_daemon, wait_until

from t3d.api.jsonrpc import DOMAIN_CODES

Json = dict[str, Any]
READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


def prompts(log: Path) -> list[str]:
    """The user messages the fake CLIs read, in order."""
    if not log.exists():
        return []
    lines = [orjson.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [line["message"]["content"] for line in lines if line.get("type") == "user"]


async def test_queued_turns_are_edited_moved_and_cancelled_before_they_start(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a turn waiting on a prompt, three turns are queued: one is edited (its prompt
    item changes, and the agent gets the new text), one moved to the front (the queue runs in
    its new order, ordinals following it), one cancelled (it never runs; cancelling again
    changes nothing). Each is idempotent with command_id; a running turn is refused with a
    pointer to turn.interrupt."""
    log = tmp_path / "host.log"
    monkeypatch.setenv("T3D_REPLAY_HOST_LOG", str(log))
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project_dir(tmp_path))
            await run_turn(client, thread_id, READ)
            busy = await client.call("turn.start", thread_id=thread_id, text=EDIT)
            request = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending")
            first = await client.call("turn.start", thread_id=thread_id, text="Now run BASH to create a file")
            second = await client.call("turn.start", thread_id=thread_id, text="COUNT to 200 slowly")
            third = await client.call("turn.start", thread_id=thread_id, text="Say ok")
            assert {first["status"], second["status"], third["status"]} == {"queued"}

            edited = await client.call("turn.edit", turn_id=second["turn_id"], text="Say ok, edited", command_id="e1")
            assert edited["status"] == "queued"
            assert await client.call("turn.edit", turn_id=second["turn_id"], text="Say ok, edited", command_id="e1") == edited
            with pytest.raises(RpcFailed):  # the same command id with other params
                await client.call("turn.edit", turn_id=second["turn_id"], text="other", command_id="e1")
            moved = await client.call("turn.move", turn_id=third["turn_id"], before=first["turn_id"], command_id="m1")
            assert moved["order"] == [third["turn_id"], first["turn_id"], second["turn_id"]]
            assert await client.call("turn.move", turn_id=third["turn_id"], before=first["turn_id"], command_id="m1") == moved
            cancelled = await client.call("turn.cancel", turn_id=first["turn_id"])
            assert cancelled["status"] == "cancelled"
            assert (await client.call("turn.cancel", turn_id=first["turn_id"]))["status"] == "cancelled"

            for method, params in (
                ("turn.edit", {"turn_id": busy["turn_id"], "text": "no"}),
                ("turn.cancel", {"turn_id": busy["turn_id"]}),
                ("turn.move", {"turn_id": busy["turn_id"]}),
            ):
                with pytest.raises(RpcFailed) as refused:
                    await client.call(method, **params)
                assert refused.value.code == DOMAIN_CODES["conflict"]
                assert "only a queued turn" in str(refused.value.message) and "turn.interrupt" in str(refused.value.message)
            with pytest.raises(RpcFailed) as refused:
                await client.call("turn.move", turn_id=second["turn_id"], before=first["turn_id"])
            assert "not waiting" in str(refused.value.message)

            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            by_id = {t["id"]: t for t in snapshot["turns"]}
            order = [third["turn_id"], second["turn_id"]]
            assert by_id[third["turn_id"]]["ordinal"] < by_id[second["turn_id"]]["ordinal"]
            [user] = [i for i in snapshot["items"] if i["id"] == f"{second['turn_id']}:user"]
            assert user["text"] == "Say ok, edited"
            ordinals = sorted(t["ordinal"] for t in snapshot["turns"])
            assert ordinals == list(range(1, len(ordinals) + 1))

            await client.call("request.respond", request_id=request["entity"]["id"], decision="allow")

            async def ran() -> bool:
                snap = await client.call("thread.snapshot", thread_id=thread_id)
                pending = [r for r in snap["requests"] if r["status"] == "pending"]
                for waiting in pending:
                    await client.call("request.respond", request_id=waiting["id"], decision="allow")
                statuses = {t["id"]: t["status"] for t in snap["turns"]}
                return all(statuses[t] in ("completed", "failed", "interrupted") for t in order)

            await wait_until(ran)
        assert prompts(log) == [READ, EDIT, "Say ok", "Say ok, edited"]
        daemon.stop()


async def test_a_held_turn_starts_with_its_edited_prompt(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn held by admission (the active-turn cap) is queued: editing it changes the
    prompt its agent gets once admission lets it start."""
    log = tmp_path / "host.log"
    monkeypatch.setenv("T3D_REPLAY_HOST_LOG", str(log))
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", max_active_turns=1)
        async with open_client(daemon) as client:
            project = project_dir(tmp_path)
            busy, waiting = await new_thread(client, project), await new_thread(client, project)
            await client.call("subscribe.thread", thread_id=busy)
            await run_turn(client, busy, READ)
            await client.call("turn.start", thread_id=busy, text=EDIT)
            request = await client.wait_event(lambda d: d["kind"] == "request.updated")
            held = await client.call("turn.start", thread_id=waiting, text=READ)

            async def is_held() -> bool:
                snapshot = await client.call("thread.snapshot", thread_id=waiting)
                return bool(snapshot["turns"][-1]["status"] == "queued")

            await wait_until(is_held)
            await client.call("turn.edit", turn_id=held["turn_id"], text="Please READ notes.txt, edited")
            await client.call("request.respond", request_id=request["entity"]["id"], decision="allow")
            await client.call("subscribe.thread", thread_id=waiting)
            await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == held["turn_id"] and d["entity"]["status"] == "completed"
            )
        assert "Please READ notes.txt, edited" in prompts(log)
        assert prompts(log).count(READ) == 1  # only the busy thread's first turn
        daemon.stop()
