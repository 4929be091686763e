"""thread.force_stop (issue 9 point 5): a real daemon, the real spawner, the fake CLI as
real processes. Force stop kills exactly the chosen thread's process group, records its
turn as cancelled (force_stop) and leaves every other agent running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import TERMINAL, RpcClient, RpcFailed, open_client, run_turn, start_daemon
from served import base_env, open_ws, serve

NOT_FOUND, CONFLICT = -32001, -32002
READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"
T3D = str(Path(sys.executable).parent / "t3d")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def waiting_threads(client: RpcClient, project_dir: Path, count: int) -> list[dict[str, Any]]:
    """``count`` replay threads, each with a live agent whose second turn waits on a prompt."""
    seen = client.record_events()
    project = await client.call("project.create", path=str(project_dir))
    threads = []
    for _ in range(count):
        thread_id = (
            await client.call("thread.create", project_id=project["project_id"], provider="replay")
        )["thread_id"]
        await client.call("subscribe.thread", thread_id=thread_id)
        assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
        turn_id = (await client.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
        request = await client.wait_event(
            lambda d, t=thread_id: (
                d["kind"] == "request.updated"
                and d["entity"]["thread_id"] == t
                and d["entity"]["status"] == "pending"
            )
        )
        pids = [
            e["entity"]["pid"]
            for e in seen
            if e["kind"] == "session.updated" and e["entity"]["thread_id"] == thread_id
        ]
        threads.append(
            {
                "thread_id": thread_id,
                "turn_id": turn_id,
                "request_id": request["entity"]["id"],
                "pid": pids[-1],
            }
        )
    return threads


async def turn_end(client: RpcClient, turn_id: str) -> dict[str, Any]:
    data = await client.wait_event(
        lambda d: (
            d["kind"] == "turn.updated"
            and d["entity"]["id"] == turn_id
            and d["entity"]["status"] in TERMINAL
        )
    )
    return data["entity"]  # type: ignore[no-any-return]


async def test_force_stop_kills_exactly_one_of_three_agents_and_records_its_turn_cancelled(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Three agents wait on a prompt; force-stopping the middle one kills its process group
    only, ends its turn cancelled/force_stop with its prompt cancelled; the other two answer
    their prompts and complete their turns with the same processes."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", force_stop_grace=2.0)
        async with open_client(daemon) as client:
            a, b, c = await waiting_threads(client, tmp_path, 3)
            assert all(alive(t["pid"]) for t in (a, b, c))

            result = await client.call("thread.force_stop", thread_id=b["thread_id"])
            assert result["pid"] == b["pid"] and result["thread_id"] == b["thread_id"]
            assert result["turn_id"] == b["turn_id"]
            assert not alive(b["pid"])
            assert alive(a["pid"]) and alive(c["pid"])

            ended = await turn_end(client, b["turn_id"])
            assert (ended["status"], ended["reason"]) == ("cancelled", "force_stop")
            assert "force-stopped" in ended["error"]
            pending = await client.call("requests.pending", thread_id=b["thread_id"])
            assert pending["requests"] == []

            for other in (a, c):
                await client.call(
                    "request.respond", request_id=other["request_id"], decision="allow"
                )
                assert (await turn_end(client, other["turn_id"]))["status"] == "completed"
                assert alive(other["pid"])

            # The stopped thread takes a new turn with a new agent.
            assert (await run_turn(client, b["thread_id"], READ)).turn["status"] == "completed"


async def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fake CLI ignoring SIGTERM, force stop waits the grace period, then SIGKILLs
    the group: the call returns the KILL exit status and the process is gone."""
    monkeypatch.setenv("T3D_FAKE_IGNORE_SIGTERM", "1")
    grace = 1.0
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", force_stop_grace=grace)
        async with open_client(daemon) as client:
            (only,) = await waiting_threads(client, tmp_path, 1)
            began = trio.current_time()
            result = await client.call("thread.force_stop", thread_id=only["thread_id"])
            assert (
                trio.current_time() - began >= grace
            )  # TERM was ignored for the whole grace period
            assert result["exit_code"] == -signal.SIGKILL
            assert not alive(only["pid"])
            ended = await turn_end(client, only["turn_id"])
            assert (ended["status"], ended["reason"]) == ("cancelled", "force_stop")


async def test_force_stop_of_a_thread_without_an_agent_says_so(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """An unknown thread gets not-found; a thread with no agent running gets conflict."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            project = await client.call("project.create", path=str(tmp_path))
            thread_id = (
                await client.call(
                    "thread.create", project_id=project["project_id"], provider="replay"
                )
            )["thread_id"]
            with pytest.raises(RpcFailed) as missing:
                await client.call("thread.force_stop", thread_id="nope")
            assert missing.value.code == NOT_FOUND
            with pytest.raises(RpcFailed) as idle:
                await client.call("thread.force_stop", thread_id=thread_id)
            assert idle.value.code == CONFLICT and "no running agent" in str(idle.value.message)


async def test_force_stop_of_an_idle_agent_says_no_turn_ran_and_then_nothing_is_left(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """After a completed turn the thread's agent idles: force stop kills it and says no turn
    was running (turn_id null); force-stopping again finds neither an agent nor a turn and
    gets conflict, instead of reporting a cancelled turn."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            seen = client.record_events()
            project = await client.call("project.create", path=str(tmp_path))
            thread_id = (await client.call("thread.create", project_id=project["project_id"], provider="replay"))["thread_id"]
            await client.call("subscribe.thread", thread_id=thread_id)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            [pid] = {e["entity"]["pid"] for e in seen if e["kind"] == "session.updated" and e["entity"]["pid"]}
            result = await client.call("thread.force_stop", thread_id=thread_id)
            assert (result["pid"], result["turn_id"]) == (pid, None)
            assert not alive(pid)
            with pytest.raises(RpcFailed) as again:
                await client.call("thread.force_stop", thread_id=thread_id)
            assert again.value.code == CONFLICT and "nothing to stop" in str(again.value.message)


async def test_ctl_stop_force_kills_the_agent_and_plain_stop_interrupts(tmp_path: Path) -> None:
    """`t3d ctl stop THREAD --force` (a real process against a real `t3d serve`) kills the
    thread's agent and says its turn ended cancelled; `t3d ctl stop THREAD` on a thread with
    nothing running fails with the daemon's reason and status 1, and so does `--force` again
    (nothing to stop), printing nothing on stdout."""
    state = tmp_path / "state"
    with trio.fail_after(60):
        async with (
            serve(state, env=base_env(T3D_FORCE_STOP_GRACE="1")) as served,
            open_ws(served) as client,
        ):
            (only,) = await waiting_threads(client, tmp_path, 1)
            ctl = [
                T3D,
                "ctl",
                "--state-dir",
                str(state),
                "--port",
                str(served.port),
                "stop",
                only["thread_id"],
            ]
            forced = await trio.run_process(
                [*ctl, "--force"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            assert forced.returncode == 0, forced.stderr
            assert b"killed its agent (process group" in forced.stdout
            assert f"turn {only['turn_id']} ended cancelled (force_stop)".encode() in forced.stdout
            assert not alive(only["pid"])
            ended = await turn_end(client, only["turn_id"])
            assert (ended["status"], ended["reason"]) == ("cancelled", "force_stop")
            plain = await trio.run_process(
                ctl, capture_stdout=True, capture_stderr=True, check=False, stdin=subprocess.DEVNULL
            )
            assert plain.returncode == 1 and b"no running or queued turn" in plain.stderr
            again = await trio.run_process(
                [*ctl, "--force"], capture_stdout=True, capture_stderr=True, check=False, stdin=subprocess.DEVNULL
            )
            assert again.returncode == 1 and b"nothing to stop" in again.stderr, again
            assert again.stdout == b""
