"""Background work under stress and bad input, through a real daemon and the fake CLI.

Each test splices real recordings (replay_fixtures/claude/) into the session it needs: a wake
that waits on a permission prompt, an agent that wakes itself in a loop, task lines naming
tasks that were never started. The lines are the real CLI's; only their order is made up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from harness import FIXTURES, http, new_thread, open_client, run_turn, start_daemon, wait_until
from test_pressure import use_psi

from t3d.domain import commands as c
from t3d.domain.decide import decide
from t3d.domain.events import SteerProviderTurn
from t3d.domain.model import ProviderSession, TurnItem
from t3d.domain.state import State
from t3d.providers.claude.background import WAKE_BURST
from t3d.providers.claude.session import ClaudeSession, SessionSpec

Json = dict[str, Any]
BASH_WAKE = FIXTURES / "claude-2.1.197_background_bash_wake.jsonl"
MULTITURN = FIXTURES / "claude-2.1.197_multiturn_tools.jsonl"


def segments(recording: Path) -> list[list[str]]:
    """A recording's lines cut before each host user line (segment 0: what comes first)."""
    cut: list[list[str]] = [[]]
    for line in recording.read_text(encoding="utf-8").splitlines():
        if line.startswith('>>> {"type":"user"'):
            cut.append([])
        cut[-1].append(line)
    return cut


def after_result(lines: list[str]) -> tuple[list[str], list[str]]:
    """A segment split after its first result line: (the turn, what the CLI wrote after)."""
    end = next(i for i, line in enumerate(lines) if line.startswith('{"type":"result"'))
    return lines[: end + 1], lines[end + 1 :]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "notes.txt").write_text("hello\n")
    return path.resolve()


def project_turns(seen: list[Json]) -> list[Json]:
    latest: dict[str, Json] = {}
    for data in seen:
        if data["kind"] == "turn.updated":
            latest[data["entity"]["id"]] = data["entity"]
    return sorted(latest.values(), key=lambda t: t["ordinal"])


async def read_until(client: Any, seen: list[Json], done: Any) -> None:
    while not done():
        await client.wait_event(lambda d: True)


async def test_a_user_turn_waits_for_a_wake_and_the_wakes_prompt_is_answered(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A wake that stops on a permission prompt is a turn like any other: the thread is
    waiting, the prompt is answered through request.respond and reaches the CLI once; a user
    turn sent meanwhile is queued behind the wake and starts after its result."""
    head, bash = segments(BASH_WAKE)[:2]
    bash_turn, bash_after = after_result(bash)
    tasks = bash_after[: next(i for i, line in enumerate(bash_after) if '"subtype":"init"' in line)]
    edit = segments(MULTITURN)[2][1:]  # the EDIT turn, without its user line: a wake
    say_ok = segments(MULTITURN)[5]
    fixture = write(tmp_path / "wake-prompt.jsonl", [*head, *bash_turn, *tasks, *edit, *say_ok])
    project = project_dir(tmp_path)
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project)
            assert (await run_turn(client, thread_id, "Please run BGBASH now")).turn[
                "status"
            ] == "completed"
            await read_until(
                client, seen, lambda: any(t["status"] == "waiting" for t in project_turns(seen))
            )
            [wake] = [t for t in project_turns(seen) if t["started_by"] == "provider"]
            assert wake["status"] == "waiting"
            queued = await client.call("turn.start", thread_id=thread_id, text="Say ok")
            assert queued["status"] == "queued"
            request = next(d["entity"] for d in seen if d["kind"] == "request.updated")
            assert request["turn_id"] == wake["id"]
            await client.call("request.respond", request_id=request["id"], decision="allow")
            await read_until(
                client,
                seen,
                lambda: sum(t["status"] == "completed" for t in project_turns(seen)) == 3,
            )
            turns = project_turns(seen)
            assert [t["started_by"] for t in turns] == ["user", "provider", "user"]
            assert turns[1]["completed_at"] <= turns[2]["started_at"]
            assert turns[2]["id"] == queued["turn_id"]
        daemon.stop()


async def test_an_agent_that_wakes_itself_in_a_loop_is_throttled(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A provider that keeps waking itself: the first WAKE_BURST wakes run, the next waits
    queued (wake_throttled, its origin saying for how long) and the thread says so; a
    throttled wake can be cancelled (its agent is interrupted), the daemon stays healthy."""
    head, bash = segments(BASH_WAKE)[:2]
    bash_turn, wake = after_result(bash)
    fixture = write(tmp_path / "flood.jsonl", [*head, *bash_turn, *(wake * (WAKE_BURST + 3))])
    project = project_dir(tmp_path)
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project)
            await run_turn(client, thread_id, "Please run BGBASH now")

            def throttled() -> list[Json]:
                return [t for t in project_turns(seen) if t["queue_reason"] == "wake_throttled"]

            def thread() -> Json:
                return [d["entity"] for d in seen if d["kind"] == "thread.updated"][-1]

            await read_until(
                client, seen, lambda: bool(throttled()) and thread()["status"] == "queued"
            )
            turns = project_turns(seen)
            wakes = [t for t in turns if t["started_by"] == "provider"]
            assert [t["status"] for t in wakes[:WAKE_BURST]] == ["completed"] * WAKE_BURST
            [held] = throttled()
            assert held["status"] == "queued" and held["origin"]["throttled_s"] > 0
            assert (thread()["status"], thread()["queue_reason"]) == ("queued", "wake_throttled")
            cancelled = await client.call("turn.cancel", turn_id=held["id"])
            assert cancelled["status"] == "cancelled"
            # The agent goes on waking itself: its next wake is held back too.
            await read_until(
                client,
                seen,
                lambda: any(t["id"] != held["id"] for t in throttled() if t["status"] == "queued"),
            )
            status, _ = await http(daemon, "GET", "/api/health", token=False)
            assert status == 200
            final = {t["id"]: t for t in project_turns(seen)}
            assert (final[held["id"]]["status"], final[held["id"]]["reason"]) == (
                "cancelled",
                "cancelled_by_user",
            )
        daemon.stop()


def task_line(subtype: str, task_id: str, session: str, **fields: Any) -> str:
    return json.dumps(
        {
            "type": "system",
            "subtype": subtype,
            "task_id": task_id,
            **fields,
            "session_id": session,
            "uuid": f"u-{task_id}-{subtype}",
        }
    )


async def test_task_lines_naming_no_known_task_are_recorded_clearly(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """task_updated / task_notification for tasks never started (mid-turn, and after the
    turn's result): each becomes a background task item saying so, in the turn or the last
    one, without a wake of its own; a task line without a task id is ignored; the turns are
    unharmed."""
    head, read_turn, edit = segments(MULTITURN)[:3]
    session = next(
        json.loads(line)["session_id"]
        for line in read_turn
        if '"session_id"' in line and not line.startswith(">>> ")
    )
    turn, _ = after_result(read_turn)
    mid = [
        task_line("task_updated", "ghost-1", session, patch={"status": "completed"}),
        task_line("task_progress", "", session),
    ]
    after = [
        task_line(
            "task_notification",
            "ghost-2",
            session,
            tool_use_id="toolu_nowhere",
            status="failed",
            summary="a ghost failed",
        )
    ]
    fixture = write(tmp_path / "ghosts.jsonl", [*head, *turn[:5], *mid, *turn[5:], *after, *edit])
    project = project_dir(tmp_path)
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(fixture))
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project)
            first = await run_turn(client, thread_id, "Please READ notes.txt")
            assert first.turn["status"] == "completed"
            await read_until(
                client,
                seen,
                lambda: (
                    sum(
                        d["entity"].get("kind") == "background_task"
                        for d in seen
                        if d["kind"] == "item.updated"
                    )
                    >= 2
                ),
            )
            second = await run_turn(client, thread_id, "Now EDIT notes.txt")
            assert second.turn["status"] == "completed"
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
        tasks = {
            i["data"]["task_id"]: i for i in snapshot["items"] if i["kind"] == "background_task"
        }
        assert sorted(tasks) == ["ghost-1", "ghost-2"]
        assert {i["turn_id"] for i in tasks.values()} == {first.turn["id"]}
        assert (tasks["ghost-1"]["status"], tasks["ghost-2"]["status"]) == ("completed", "failed")
        assert all("no task_started" in i["data"]["note"] for i in tasks.values())
        assert [t["started_by"] for t in snapshot["turns"]] == ["user", "user"]  # no wake
        assert snapshot["tasks"] == []
        daemon.stop()


async def test_a_wake_while_the_daemon_stops_its_agents_leaves_nothing_open(tmp_path: Path) -> None:
    """The daemon stops (and stops its agents) while a background command runs: the
    agent's end stops the task, and the next daemon on the state dir finds no open turn and no
    task listed as running."""
    project = project_dir(tmp_path)
    state = tmp_path / "state"
    with trio.fail_after(40):
        async with trio.open_nursery() as first:
            daemon = await start_daemon(
                first, state, replay_fixture=str(BASH_WAKE), replay_speed=0.2
            )
            async with open_client(daemon) as client:
                thread_id = await new_thread(client, project)
                before = await run_turn(client, thread_id, "Please run BGBASH now")
                [task] = before.of_kind("background_task")
                assert task["status"] == "running"
            daemon.stop()
        async with trio.open_nursery() as second:
            daemon = await start_daemon(second, state, replay_fixture=str(BASH_WAKE))
            async with open_client(daemon) as client:
                snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            daemon.stop()
    assert [t["status"] for t in snapshot["turns"]] == ["completed"]
    assert snapshot["tasks"] == [] and snapshot["thread"]["running_tasks"] == []
    [item] = [i for i in snapshot["items"] if i["kind"] == "background_task"]
    assert item["status"] == "stopped"


async def test_a_steer_into_a_turn_that_just_ended_becomes_a_turn_of_its_own() -> None:
    """The session gets a steered message for a turn it has ended (its result came just
    before): the message is not written into nothing; it becomes an ordinary turn, queued or
    started as any, and the steer's item in the ended turn says which turn it became."""
    written: list[c.Command] = []

    async def write(command: c.Command) -> bool:
        written.append(command)
        return True

    spec = SessionSpec("t-a", "replay", ("fake",), "/", {}, None, None, None, interrupt_timeout=5.0)
    session = ClaudeSession(spec, write, spawner=None, clock=lambda: 1.0)  # type: ignore[arg-type]
    await session._steer(SteerProviderTurn("t-a", "u-ended", "u-ended:steer:s1", "s1", "also this"))
    assert written == [c.RequeueSteer("t-a", "u-ended:steer:s1", "s1", "also this")]

    state = State()
    for command in (
        c.CreateProject("p", "/w"),
        c.CreateThread("t-a", "p", "replay"),
        c.StartTurn("t-a", "u-ended", "go"),
        c.MarkTurnRunning("u-ended"),
        c.StartTurn("t-a", "s1", "also this", "steer"),
        c.FinishTurn("u-ended", "completed"),
        *written,
    ):
        for event in decide(state, command, 1.0).events:
            state.apply(event)
    assert (state.turns["s1"].status, state.turns["s1"].ordinal) == ("starting", 2)
    assert state.items["s1:user"].text == "also this"
    assert state.items["u-ended:steer:s1"].data["requeued_as"] == "s1"  # type: ignore[index]


async def test_a_wake_under_memory_pressure_waits_for_admission_like_any_turn(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Severe memory pressure begins after a turn that left a background command running: the
    wake its end brings is held queued (memory_pressure) and its agent writes nothing into it
    meanwhile; once the pressure clears it is admitted, runs, and ends with its result."""
    root = tmp_path / "psi"
    use_psi(root, "calm.txt")
    project = project_dir(tmp_path)
    with trio.fail_after(90):
        # At a fifth of the recorded pace the wake comes ~9 s after the first turn's result.
        daemon = await start_daemon(
            nursery,
            tmp_path / "state",
            replay_fixture=str(BASH_WAKE),
            replay_speed=0.2,
            psi_root=str(root),
            pressure_interval=0.2,
            pressure_admission="on",
        )
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project)
            first = await run_turn(client, thread_id, "Please run BGBASH now")
            assert first.turn["status"] == "completed"
            use_psi(root, "host_severe.txt")

            async def severe() -> bool:
                _, health = await http(daemon, "GET", "/api/health")
                return bool(health["memory_pressure"]["level"] == "severe")

            await wait_until(severe, 0.1)
            assert not [t for t in project_turns(seen) if t["started_by"] == "provider"], (
                "the wake came too early"
            )

            def wakes() -> list[Json]:
                return [t for t in project_turns(seen) if t["started_by"] == "provider"]

            await read_until(
                client, seen, lambda: any(t["queue_reason"] == "memory_pressure" for t in wakes())
            )
            [held] = wakes()
            assert held["status"] == "queued"
            _, health = await http(daemon, "GET", "/api/health")
            assert health["admission"]["held_turns"] == 1
            await trio.sleep(1.0)  # the agent waits on its pipe: nothing of the wake is recorded
            items = {
                d["entity"]["id"]: d["entity"]
                for d in seen
                if d["kind"] == "item.updated" and d["entity"]["turn_id"] == held["id"]
            }
            assert [i["kind"] for i in items.values()] == ["wake"]

            use_psi(root, "calm.txt")
            await read_until(client, seen, lambda: wakes()[0]["status"] == "completed")
            items = {
                d["entity"]["id"]: d["entity"]
                for d in seen
                if d["kind"] == "item.updated" and d["entity"]["turn_id"] == held["id"]
            }
            assert "assistant_message" in [i["kind"] for i in items.values()]
            assert [t["status"] for t in project_turns(seen)] == ["completed", "completed"]
        daemon.stop()


def test_restart_recovery_stops_the_tasks_of_agents_gone_and_keeps_those_taken_over() -> None:
    """After a restart, the background tasks of a thread whose agent was not taken over are
    stopped (saying why) and the thread lists none; a taken-over agent's tasks run on."""

    def task(thread_id: str, turn_id: str) -> TurnItem:
        return TurnItem(
            id=f"{turn_id}:task:b1",
            thread_id=thread_id,
            turn_id=turn_id,
            ordinal=0,
            kind="background_task",
            status="running",
            title="sleep 60",
            text=None,
            data={"task_id": "b1", "status": "running"},
            updated_at=1.0,
        )

    def recovered(live: tuple[str, ...]) -> State:
        state = State()
        for command in (
            c.CreateProject("p", "/w"),
            *(c.CreateThread(t, "p", "replay") for t in ("t-gone", "t-kept")),
            *(
                c.RecordSession(ProviderSession(f"s-{t}", t, "replay", "running", 1.0))
                for t in ("t-gone", "t-kept")
            ),
            *(c.StartTurn(t, f"u-{t}", "go") for t in ("t-gone", "t-kept")),
            *(c.MarkTurnRunning(f"u-{t}") for t in ("t-gone", "t-kept")),
            *(c.RecordTasks(t, (task(t, f"u-{t}"),)) for t in ("t-gone", "t-kept")),
            *(c.FinishTurn(f"u-{t}", "completed") for t in ("t-gone", "t-kept")),
            c.RecoverAfterRestart(live),
        ):
            for event in decide(state, command, 1.0).events:
                state.apply(event)
        return state

    state = recovered(("s-t-kept",))
    gone = state.items["u-t-gone:task:b1"]
    assert gone.status == "stopped" and "restarted" in (gone.data or {})["note"]
    assert state.threads["t-gone"].running_tasks == []
    assert state.items["u-t-kept:task:b1"].status == "running"
    assert state.threads["t-kept"].running_tasks == ["u-t-kept:task:b1"]
    assert recovered(()).threads["t-kept"].running_tasks == []
