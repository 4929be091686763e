"""What works for Claude works for Codex, through the daemon: checkpoints with diff and revert,
force stop, memory pressure's heaviest agents, admission, restart recovery with
``thread/resume``, runtime modes, `t3d ctl run`, and the spawner (the daemon never forks).

The agents are the fake ``codex`` (``replay-codex``) replaying the bundled recordings (or a
variant with a file change, whose shape comes from codex 0.171.0's JSON Schema because the
CLI could not be made to emit one), as real subprocesses started by the real spawner.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio
from git_support import git, make_repo
from harness import (
    TERMINAL,
    RpcClient,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
    wait_until,
)
from served import base_env, kill_leftovers, open_ws, provider_pids, serve, wait_gone

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
MULTITURN = REPO / "replay_fixtures" / "codex" / "codex-0.171.0_app-server_multiturn.jsonl"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
T3D = str(Path(sys.executable).parent / "t3d")
PING, SHELL, PATCH, SLOW = "ping", "Please run SHELL", "Please PATCH", "SLOW count please"
PATCH_DIFF = "@@ -1 +1 @@\n-hello\n+hello, world\n"


def with_file_change(target: Path) -> Path:
    """The multiturn recording with a file change in its PATCH turn: notes.txt updated and
    added.txt added, asked for with item/fileChange/requestApproval (answered accept)."""
    lines = MULTITURN.read_text().splitlines()
    thread_id = json.loads(lines[6])["result"]["thread"]["id"]
    start = next(i for i, raw in enumerate(lines) if raw.startswith(">>> ") and '"Please PATCH"' in raw)
    turn_id = next(json.loads(raw)["result"]["turn"]["id"] for raw in lines[start:] if raw.startswith('{"id":'))
    at = next(i for i in range(start, len(lines)) if '"type":"agentMessage"' in lines[i])
    ids = {"threadId": thread_id, "turnId": turn_id}
    changes = [
        {"path": "notes.txt", "kind": {"type": "update", "move_path": None}, "diff": PATCH_DIFF},
        {"path": "added.txt", "kind": {"type": "add"}, "diff": "added by codex\n"},
    ]
    item = {"type": "fileChange", "id": "call_patch_1", "changes": changes, "status": "inProgress"}
    inserted = [
        {"method": "item/started", "params": {"item": item, **ids, "startedAtMs": 1}},
        {"method": "item/fileChange/requestApproval", "id": 1, "params": {"itemId": "call_patch_1", **ids, "reason": None, "grantRoot": None, "startedAtMs": 1}},
        ">>> " + json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"decision": "accept"}}),
        {"method": "serverRequest/resolved", "params": {"threadId": thread_id, "requestId": 1}},
        {"method": "item/completed", "params": {"item": {**item, "status": "completed"}, **ids, "completedAtMs": 2}},
    ]
    text = [raw if isinstance(raw, str) else json.dumps(raw) for raw in inserted]
    target.write_text("\n".join([*lines[:at], *text, *lines[at:]]) + "\n")
    return target


def pid_of(seen: list[Json], thread_id: str) -> int:
    return [e["entity"]["pid"] for e in seen if e["kind"] == "session.updated" and e["entity"]["thread_id"] == thread_id][-1]


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def checkpoint_of(client: RpcClient, turn_id: str) -> Json:
    event = await client.wait_event(
        lambda d: d["kind"] == "item.updated" and d["entity"]["turn_id"] == turn_id and d["entity"]["kind"] == "checkpoint"
    )
    return dict(event["entity"])


async def waiting_on_approval(client: RpcClient, thread_id: str) -> tuple[str, str]:
    """Start the SHELL turn and wait until its approval is pending: (turn id, request id)."""
    assert (await run_turn(client, thread_id, PING)).turn["status"] == "completed"
    turn_id = (await client.call("turn.start", thread_id=thread_id, text=SHELL))["turn_id"]
    request = await client.wait_event(
        lambda d: d["kind"] == "request.updated" and d["entity"]["thread_id"] == thread_id and d["entity"]["status"] == "pending"
    )
    return turn_id, request["entity"]["id"]


async def turn_end(client: RpcClient, turn_id: str) -> Json:
    data = await client.wait_event(
        lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in TERMINAL
    )
    return dict(data["entity"])


async def test_checkpoints_diff_and_revert_follow_a_codex_file_change(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A Codex file change (approved) changes the files (the fake applies it), the turn's
    checkpoint lists them against the turn's own baseline, checkpoint.diff shows the patch,
    and checkpoint.revert to the turn before restores notes.txt and deletes added.txt."""
    project = make_repo(tmp_path / "repo")
    fixture = with_file_change(tmp_path / "codex-0.171.0_app-server_multiturn_patch.jsonl")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_codex_fixture=str(fixture))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="replay-codex")
            for text in (PING, SHELL):
                outcome = await run_turn(client, thread_id, text)
                await checkpoint_of(client, outcome.turn["id"])
            patched = await run_turn(client, thread_id, PATCH)
            assert patched.turn["status"] == "completed"
            (change,) = patched.of_kind("file_change")
            assert (change["title"], change["status"]) == ("Edit notes.txt, added.txt", "completed")
            (approval,) = patched.of_kind("approval_request")
            assert (approval["title"], approval["status"]) == ("file change", "allowed")
            checkpoint = await checkpoint_of(client, patched.turn["id"])
            assert {f["path"] for f in checkpoint["data"]["files"]} == {"notes.txt", "added.txt"}
            assert checkpoint["data"]["base_ref"].endswith("/2")  # counted from the last checkpoint
            diff = await client.call("checkpoint.diff", thread_id=thread_id, from_ordinal=2, to_ordinal=3)
            assert "-hello\n+hello, world\n" in diff["diff"] and "+added by codex" in diff["diff"]
            reverted = await client.call("checkpoint.revert", thread_id=thread_id, ordinal=2)
            assert (reverted["restored"], reverted["deleted"]) == (1, 1)
            assert (project / "notes.txt").read_text() == "hello\n" and not (project / "added.txt").exists()
        daemon.stop()
    assert git(project, "status", "--porcelain") == ""


async def test_force_stop_kills_one_codex_agent_and_leaves_the_others(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Two Codex agents and one Claude agent wait on an approval; force-stopping one Codex
    thread kills its process group only and ends its turn cancelled (force_stop); the other
    two answer and complete with the same processes; the stopped thread starts a new agent."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", force_stop_grace=2.0)
        async with open_client(daemon) as client:
            seen = client.record_events()
            a = await new_thread(client, tmp_path, provider="replay-codex")
            b = await new_thread(client, tmp_path, provider="replay-codex")
            claude = await new_thread(client, tmp_path, provider="replay")
            waits = {thread: await waiting_on_approval(client, thread) for thread in (a, b)}
            assert (await run_turn(client, claude, "Please READ notes.txt")).turn["status"] == "completed"
            claude_turn = (await client.call("turn.start", thread_id=claude, text="Now EDIT notes.txt"))["turn_id"]
            claude_request = await client.wait_event(
                lambda d: d["kind"] == "request.updated" and d["entity"]["thread_id"] == claude
            )
            pids = {thread: pid_of(seen, thread) for thread in (a, b, claude)}

            stopped = await client.call("thread.force_stop", thread_id=b)
            assert stopped["pid"] == pids[b] and not alive(pids[b])
            ended = await turn_end(client, waits[b][0])
            assert (ended["status"], ended["reason"]) == ("cancelled", "force_stop")
            assert alive(pids[a]) and alive(pids[claude])

            await client.call("request.respond", request_id=waits[a][1], decision="allow")
            assert (await turn_end(client, waits[a][0]))["status"] == "completed"
            await client.call("request.respond", request_id=claude_request["entity"]["id"], decision="allow")
            assert (await turn_end(client, claude_turn))["status"] == "completed"
            assert alive(pids[a]) and alive(pids[claude])
            again = await run_turn(client, b, PING)
            assert again.turn["status"] == "completed" and pid_of(seen, b) != pids[b]
        daemon.stop()


async def test_memory_pressure_names_codex_agents_among_the_heaviest(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Under severe (fixture) pressure the heaviest agents are a Codex and a Claude thread,
    each sized by its process group's PSS."""
    root = tmp_path / "psi"
    (root / "proc/pressure").mkdir(parents=True)
    (root / "proc/pressure/memory").write_bytes((FIXTURES / "psi" / "calm.txt").read_bytes())
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", psi_root=str(root), pressure_interval=0.05)
        async with open_client(daemon) as client:
            codex = await new_thread(client, tmp_path, provider="replay-codex")
            claude = await new_thread(client, tmp_path, provider="replay")
            assert (await run_turn(client, codex, PING)).turn["status"] == "completed"
            assert (await run_turn(client, claude, "Please READ notes.txt")).turn["status"] == "completed"
            await client.call("subscribe.server", memory_pressure=True)
            (root / "proc/pressure/memory.new").write_bytes((FIXTURES / "psi" / "host_severe.txt").read_bytes())
            os.replace(root / "proc/pressure/memory.new", root / "proc/pressure/memory")
            while True:
                note = await client.next_notification()
                if note["kind"] == "memory_pressure" and note["data"]["level"] == "severe":
                    break
            agents = note["data"]["agents"]
            assert sorted(agent["thread_id"] for agent in agents) == sorted([codex, claude])
            assert all(agent["source"] == "pss" and agent["memory_bytes"] > 1 << 20 for agent in agents)
        daemon.stop()


async def test_the_active_turn_cap_queues_codex_turns_in_order(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With max_active_turns 1, a second Codex thread's turn is queued (max_active_turns) while
    the first waits on its approval, and starts once the first ends."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", max_active_turns=1)
        async with open_client(daemon) as client:
            first = await new_thread(client, tmp_path, provider="replay-codex")
            second = await new_thread(client, tmp_path, provider="replay-codex")
            turn_id, request_id = await waiting_on_approval(client, first)
            held = await client.call("turn.start", thread_id=second, text=PING)
            queued = await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == held["turn_id"] and d["entity"]["status"] == "queued"
            )
            assert queued["entity"]["queue_reason"] == "max_active_turns"
            await client.call("request.respond", request_id=request_id, decision="deny")
            assert (await turn_end(client, turn_id))["status"] == "completed"
            assert (await turn_end(client, held["turn_id"]))["status"] == "completed"
        daemon.stop()


def host_messages(log: Path) -> list[Json]:
    return [json.loads(raw) for raw in log.read_text().splitlines()] if log.exists() else []


async def test_runtime_modes_reach_codex_as_approval_policy_and_sandbox(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    """thread/start carries the thread's runtime mode as Codex's approval policy and sandbox,
    its model, and its directory; the initialize names t3d as the client."""
    log = tmp_path / "host.jsonl"
    monkeypatch.setenv("T3D_REPLAY_HOST_LOG", str(log))
    expected = {
        "approval-required": ("untrusted", "workspace-write"),
        "auto-accept-edits": ("on-request", "workspace-write"),
        "full-access": ("never", "danger-full-access"),
    }
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            for mode, (policy, sandbox) in expected.items():
                thread_id = await new_thread(client, tmp_path, provider="replay-codex", runtime_mode=mode, model="gpt-mock")
                before = len(host_messages(log))
                assert (await run_turn(client, thread_id, PING)).turn["status"] == "completed"
                sent = host_messages(log)[before:]
                assert sent[0]["method"] == "initialize" and sent[0]["params"]["clientInfo"]["name"] == "t3d"
                (start,) = [m for m in sent if m.get("method") == "thread/start"]
                assert start["params"] == {"cwd": str(tmp_path), "approvalPolicy": policy, "sandbox": sandbox, "model": "gpt-mock"}
        daemon.stop()


async def test_kill_9_mid_codex_turn_without_a_reattach_window_resumes_the_codex_thread(tmp_path: Path) -> None:
    """kill -9 while a Codex turn streams (the recording's slow count, held at its interrupt
    point) with ``--agent-reattach-window 0``: the spawner stops the agent at once, and after a
    restart the turn is interrupted (server_restart) and the thread's next turn starts a new
    app-server that resumes the same Codex thread (thread/resume with the stored native session
    id). (With a window, the agent is taken over instead: tests/test_codex_reattach.py.)"""
    state, log = tmp_path / "state", tmp_path / "host.jsonl"
    env = base_env(CODEX_HOME=str(tmp_path / "codex-home"), T3D_REPLAY_HOST_LOG=str(log))
    pids: list[int] = []
    try:
        with trio.fail_after(60):
            async with serve(state, "--agent-reattach-window", "0", env=env) as daemon, open_ws(daemon) as client:
                seen = client.record_events()
                thread_id = await new_thread(client, tmp_path, provider="replay-codex")
                for text in (PING, SHELL, PATCH):  # the fake plays the recorded turns in order
                    assert (await run_turn(client, thread_id, text)).turn["status"] == "completed"
                native = [e["entity"]["native_session_id"] for e in seen if e["kind"] == "session.updated"][-1]
                turn_id = (await client.call("turn.start", thread_id=thread_id, text=SLOW))["turn_id"]
                await client.wait_event(
                    lambda d: d["entity"].get("turn_id") == turn_id and d["entity"].get("kind") == "assistant_message"
                )
                pids = await provider_pids(daemon)
                daemon.process.send_signal(signal.SIGKILL)
                await daemon.process.wait()
            assert await wait_gone(pids, 20) == []
            async with serve(state, env=env) as daemon, open_ws(daemon) as client:
                snapshot = await client.call("thread.snapshot", thread_id=thread_id)
                (turn,) = [t for t in snapshot["turns"] if t["id"] == turn_id]
                assert (turn["status"], turn["reason"]) == ("interrupted", "server_restart")
                seen = client.record_events()
                await client.call("subscribe.thread", thread_id=thread_id)
                after = await run_turn(client, thread_id, PING)
                assert after.turn["status"] == "completed" and after.turn["ordinal"] == 5
                sessions = [e["entity"] for e in seen if e["kind"] == "session.updated"]
                assert sessions[-1]["native_session_id"] == native
                pids += await provider_pids(daemon)
        opened = [m for m in host_messages(log) if m.get("method") in ("thread/start", "thread/resume")]
        assert [m["method"] for m in opened] == ["thread/start", "thread/resume"]
        assert opened[1]["params"]["threadId"] == native
    finally:
        kill_leftovers(pids, state)


async def test_ctl_run_drives_a_codex_thread_and_answers_its_approval(tmp_path: Path) -> None:
    """`t3d ctl run --provider replay-codex` runs in its scratch project, says once that it
    plays a recording, prints Codex's reply and exits 0; on the same thread `--approve all`
    allows the command and prints it, its recorded output and the reply."""
    with trio.fail_after(60):
        async with serve(tmp_path / "state") as daemon:
            common = ["ctl", "--state-dir", str(tmp_path / "state"), "--port", str(daemon.port)]
            first = await trio.run_process(
                [T3D, *common, "run", "--provider", "replay-codex", PING],
                capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
            )  # fmt: skip
            assert first.returncode == 0, first.stderr
            assert "pong from the mock model" in first.stdout.decode()
            scratch = tmp_path / "state" / "replay-codex-demo"
            assert f"note: the replay runs in a scratch project, {scratch}" in first.stderr.decode()
            assert first.stderr.decode().count("replay-codex plays a recorded Codex session") == 1
            thread_id = first.stderr.decode().split("\nthread ", 1)[1].split()[0]
            second = await trio.run_process(
                [T3D, *common, "run", "--thread", thread_id, "--approve", "all", SHELL],
                capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
            )  # fmt: skip
            assert second.returncode == 0, second.stderr
            out = second.stdout.decode()
            assert "⏺ /bin/bash -lc 'touch created-by-codex.txt && ls'" in out
            assert "  ⎿  recorded: README.md (+1 lines)" in out and "Done. Tool output was" in out


async def test_the_daemon_never_forks_for_codex_agents(tmp_path: Path) -> None:
    """With Codex threads running turns (one with an approval), the daemon creates no process
    after start-up: the app-servers are the spawner's children."""
    audit = tmp_path / "audit.jsonl"
    env = base_env(T3D_AUDIT_LOG=str(audit))
    launcher = (str(FIXTURES / "audited_t3d.py"),)
    with trio.fail_after(60):
        async with serve(tmp_path / "state", env=env, launcher=launcher) as daemon:
            at_start = audit.read_text().splitlines()
            async with open_ws(daemon) as client:
                threads = [await new_thread(client, tmp_path, provider="replay-codex") for _ in range(2)]
                for thread_id in threads:
                    for text in (PING, SHELL):
                        assert (await run_turn(client, thread_id, text)).turn["status"] == "completed"
                pids = await provider_pids(daemon)
                await wait_until(lambda: all(alive(pid) for pid in pids))
                parents = {parent_pid(pid) for pid in pids}
            after = audit.read_text().splitlines()
            daemon.process.send_signal(signal.SIGTERM)
            assert await daemon.process.wait() == 0
    assert after == at_start, f"the daemon created processes after start-up: {after[len(at_start):]}"
    assert len(pids) == 2 and daemon.process.pid not in parents and len(parents) == 1


async def test_an_idle_codex_is_stopped_and_the_next_turn_resumes_its_thread(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: Any
) -> None:
    """After provider_idle_timeout the app-server exits cleanly (stdin closed); the next turn
    starts a new one that resumes the same Codex thread, and archiving the thread stops it."""
    log = tmp_path / "host.jsonl"
    monkeypatch.setenv("T3D_REPLAY_HOST_LOG", str(log))
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", provider_idle_timeout=0.4)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, provider="replay-codex")
            seen = client.record_events()
            assert (await run_turn(client, thread_id, PING)).turn["status"] == "completed"
            exited = await client.wait_event(lambda d: d["kind"] == "session.updated" and d["entity"]["status"] == "exited")
            assert exited["entity"]["exit_code"] == 0 and exited["entity"]["native_session_id"]
            assert (await run_turn(client, thread_id, PING)).turn["status"] == "completed"  # turn 1 again
            sessions = [d["entity"] for d in seen if d["kind"] == "session.updated"]
            new = [s for s in sessions if s["id"] != exited["entity"]["id"]]
            assert new and new[-1]["native_session_id"] == exited["entity"]["native_session_id"]
            await client.call("thread.archive", thread_id=thread_id)
            await client.wait_event(
                lambda d: d["kind"] == "session.updated" and d["entity"]["id"] == new[-1]["id"] and d["entity"]["status"] == "exited"
            )
        daemon.stop()
    opened = [m for m in host_messages(log) if m.get("method") in ("thread/start", "thread/resume")]
    assert [m["method"] for m in opened] == ["thread/start", "thread/resume"]
    assert opened[1]["params"]["threadId"] == exited["entity"]["native_session_id"]
