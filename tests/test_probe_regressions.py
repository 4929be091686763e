"""What an outside fault probe found contained must stay contained (issue 14's good results).

A real `t3d serve` (tests/served.py) with the real spawner runs `tests/fixtures/abusive_claude`,
a fake Claude CLI speaking the real stream-json protocol, as the ``claude`` provider through a
one-line wrapper in ``tmp_path``. The abuse is volume: one 100 MiB stdout line (over the
32 MiB line cap), 50 MiB of stderr, 20,000 control requests. Each test checks that only the
abusive turn is affected, that the daemon keeps serving another thread and `/api/health`
meanwhile, and that the daemon's memory (VmHWM and VmRSS from /proc, against bounds far
below what holding the abuse would cost) stays bounded.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from harness import TEST_FIXTURES, http, new_thread, run_turn, wait_until
from served import Served, base_env, kill_leftovers, open_ws, query, serve

from t3d.domain.model import MAX_PENDING_REQUESTS
from t3d.providers.claude.process import STDERR_TAIL
from t3d.providers.lines import DEFAULT_MAX_LINE

ABUSIVE = TEST_FIXTURES / "abusive_claude"
MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory figures from /proc")


def abusive_claude(tmp_path: Path, mode: str) -> tuple[str, Path]:
    """A `claude` binary misbehaving in ``mode`` on its first launch, and its report file."""
    report = tmp_path / f"{mode}.report.json"
    script = tmp_path / f"claude-{mode}"
    script.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' '{ABUSIVE}' --mode {mode} "
        f"--launches '{tmp_path / f'{mode}.launches'}' --report '{report}' \"$@\"\n"
    )
    script.chmod(0o755)
    return str(script), report


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak) of ``pid``, in MiB."""
    figures = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                figures[key] = int(value.split()[0]) / 1024
    return figures


async def spawner_pid(daemon: Served) -> int:
    status, body = await http(daemon, "GET", "/api/health", token=True)
    assert status == 200, body
    return int(body["spawner"]["pid"])


async def health_answers(daemon: Served) -> None:
    """/api/health answers 200 (bounded generously: the machine may be loaded)."""
    with trio.fail_after(20):
        status, body = await http(daemon, "GET", "/api/health", token=False)
    assert status == 200 and body["status"] in ("ok", "degraded"), body


def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    (path / "other").mkdir(parents=True, exist_ok=True)
    return path.resolve()


async def keep_serving(daemon: Served, tmp_path: Path, turns: list[dict[str, Any]], abused_done: trio.Event) -> None:
    """Another thread (the replay provider) takes turns, and health answers, until the abused
    turn has ended (and at least once)."""
    async with open_ws(daemon) as client:
        project_id = (await client.call("project.create", path=str(project(tmp_path) / "other")))["project_id"]
        while True:  # a new thread each time: the replay plays its recording from the start
            thread_id = (await client.call("thread.create", project_id=project_id, provider="replay"))["thread_id"]
            await client.call("subscribe.thread", thread_id=thread_id)
            outcome = await run_turn(client, thread_id, "Please READ notes.txt")
            turns.append(outcome.turn)
            await health_answers(daemon)
            if abused_done.is_set():
                return


async def abused_turn_with_company(daemon: Served, tmp_path: Path, text: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """Run ``text`` on a claude thread while another thread keeps taking turns; return the
    abused turn, the other thread's turns and the claude thread's id."""
    other: list[dict[str, Any]] = []
    done = trio.Event()
    async with open_ws(daemon) as client, trio.open_nursery() as nursery:
        thread_id = await new_thread(client, project(tmp_path), provider="claude")
        nursery.start_soon(keep_serving, daemon, tmp_path, other, done)
        outcome = await run_turn(client, thread_id, text)
        done.set()
    return outcome.turn, other, thread_id


async def sessions_of(daemon: Served, thread_id: str) -> list[dict[str, Any]]:
    rows = await query(daemon.db_path, "SELECT body FROM sessions WHERE thread_id = ? ORDER BY rowid", thread_id)
    return [orjson.loads(body) for (body,) in rows]


async def test_a_100_mib_provider_line_fails_only_its_turn_and_memory_stays_bounded(tmp_path: Path) -> None:
    """A Claude CLI that writes one 100 MiB assistant line and a 100 MiB result line (both over
    the 32 MiB cap) and then waits: its turn fails at once (not at the silence timeout) with
    reason ``provider_line_too_long`` and an error naming the line's size and the limit; its
    process is stopped and the thread's next turn runs on a new one; another thread takes
    turns throughout; the daemon's peak RSS grows by less than the line (the line is dropped
    as it arrives, never held whole), its RSS afterwards is back near where it started, and
    the spawner's peak stays under the line's size too."""
    binary, _ = abusive_claude(tmp_path, "huge-line")
    state = tmp_path / "state"
    try:
        with trio.fail_after(240):
            async with serve(state, "--claude-bin", binary, env=base_env(ABUSIVE_MIB="100")) as daemon:
                spawner = await spawner_pid(daemon)
                before, spawner_before = memory_mib(daemon.process.pid), memory_mib(spawner)
                with trio.fail_after(90):  # without the cap's handling it runs until the silence timeout
                    turn, other, thread_id = await abused_turn_with_company(daemon, tmp_path, "say a lot")
                assert (turn["status"], turn["reason"]) == ("failed", "provider_line_too_long"), turn
                assert f"over t3d's limit of {DEFAULT_MAX_LINE} bytes" in turn["error"], turn["error"]
                size = re.search(r"wrote a stdout line of (\d+) bytes", turn["error"])
                assert size is not None and 100 * MIB < int(size.group(1)) < 101 * MIB, turn["error"]
                assert other and all(t["status"] == "completed" for t in other), other
                await health_answers(daemon)

                after, spawner_after = memory_mib(daemon.process.pid), memory_mib(spawner)
                assert after["VmHWM"] - before["VmRSS"] < 96, (before, after)
                assert after["VmRSS"] - before["VmRSS"] < 48, (before, after)
                assert spawner_after["VmHWM"] - spawner_before["VmRSS"] < 96, (spawner_before, spawner_after)

                async with open_ws(daemon) as client:
                    await client.call("subscribe.thread", thread_id=thread_id)
                    again = await run_turn(client, thread_id, "and now briefly")
                assert again.turn["status"] == "completed", again.turn
                assert again.assistant_text == ["ok: and now briefly"]
                first, second = await sessions_of(daemon, thread_id)
                assert first["status"] == "exited" and first["pid"] != second["pid"]
                assert "Traceback" not in daemon.stderr_text()
    finally:
        kill_leftovers([], state)


async def test_50_mib_of_stderr_neither_blocks_the_turn_nor_is_kept(tmp_path: Path) -> None:
    """A Claude CLI that writes 50 MiB to stderr during each turn: the first turn completes
    with its normal reply; the second, after which the CLI exits 3, fails ``provider_exited``
    with the stderr's last line in its error; the session record keeps only the last
    `STDERR_TAIL` (8 KiB) of stderr, ending with that line; another thread takes turns and
    health answers throughout; the daemon's and the spawner's memory stay far below 50 MiB
    of growth."""
    binary, _ = abusive_claude(tmp_path, "stderr-flood")
    state = tmp_path / "state"
    try:
        with trio.fail_after(240):
            async with serve(state, "--claude-bin", binary, env=base_env(ABUSIVE_MIB="50")) as daemon:
                spawner = await spawner_pid(daemon)
                before, spawner_before = memory_mib(daemon.process.pid), memory_mib(spawner)
                turn, other, thread_id = await abused_turn_with_company(daemon, tmp_path, "first")
                assert turn["status"] == "completed", turn
                assert other and all(t["status"] == "completed" for t in other), other

                async with open_ws(daemon) as client:
                    await client.call("subscribe.thread", thread_id=thread_id)
                    last = await run_turn(client, thread_id, "second")
                assert (last.turn["status"], last.turn["reason"]) == ("failed", "provider_exited"), last.turn
                assert last.turn["error"].endswith("status 3 before the turn finished: stderr flood: the end"), last.turn["error"]

                async def exited() -> bool:
                    return [s["status"] for s in await sessions_of(daemon, thread_id)] == ["exited"]

                with trio.fail_after(30):
                    await wait_until(exited)
                (session,) = await sessions_of(daemon, thread_id)
                assert session["exit_code"] == 3
                assert session["stderr_tail"].endswith("stderr flood: the end")
                assert len(session["stderr_tail"].encode()) <= STDERR_TAIL
                await health_answers(daemon)
                after, spawner_after = memory_mib(daemon.process.pid), memory_mib(spawner)
                assert after["VmHWM"] - before["VmRSS"] < 32, (before, after)
                assert spawner_after["VmHWM"] - spawner_before["VmRSS"] < 32, (spawner_before, spawner_after)
    finally:
        kill_leftovers([], state)


async def test_a_flood_of_control_requests_is_answered_and_contained(tmp_path: Path) -> None:
    """A Claude CLI that sends 20,000 `control_request` lines of a subtype t3d does not serve
    (hook_callback) mid-turn: every one gets an error `control_response` with its own
    request id (none left hanging, no other answer), no request is opened, the turn then
    completes with its normal reply, another thread takes turns and health answers
    throughout, and the daemon's memory grows by less than 32 MiB."""
    binary, report = abusive_claude(tmp_path, "control-flood")
    state = tmp_path / "state"
    try:
        with trio.fail_after(240):
            async with serve(state, "--claude-bin", binary, env=base_env(ABUSIVE_COUNT="20000")) as daemon:
                before = memory_mib(daemon.process.pid)
                turn, other, thread_id = await abused_turn_with_company(daemon, tmp_path, "hooks galore")
                assert turn["status"] == "completed", turn
                assert other and all(t["status"] == "completed" for t in other), other
                summary = orjson.loads(report.read_bytes())
                assert summary["responses"] == summary["errors"] == 20_000, {k: summary[k] for k in ("responses", "errors")}
                assert summary["answered"] == sorted(f"flood_{n}" for n in range(20_000))
                requests = await query(daemon.db_path, "SELECT count(*) FROM requests WHERE thread_id = ?", thread_id)
                assert requests == [(0,)]
                await health_answers(daemon)
                after = memory_mib(daemon.process.pid)
                assert after["VmHWM"] - before["VmRSS"] < 32, (before, after)
                async with open_ws(daemon) as client:
                    await client.call("subscribe.thread", thread_id=thread_id)
                    again = await run_turn(client, thread_id, "still there")
                assert again.assistant_text == ["ok: still there"]
    finally:
        kill_leftovers([], state)



async def test_a_flood_of_permission_prompts_opens_at_most_the_bound(tmp_path: Path) -> None:
    """A Claude CLI that sends 1,000 `can_use_tool` prompts in one turn: at most
    MAX_PENDING_REQUESTS are pending (requests.pending), every other one is denied to the
    CLI at once with a message naming the bound, health answers meanwhile, and answering
    the pending ones lets the turn complete with its normal reply."""
    count = 1000
    binary, report = abusive_claude(tmp_path, "prompt-flood")
    state = tmp_path / "state"

    def summary() -> dict[str, Any]:
        return orjson.loads(report.read_bytes()) if report.exists() else {"responses": 0}

    try:
        with trio.fail_after(240):
            async with serve(state, "--claude-bin", binary, env=base_env(ABUSIVE_COUNT=str(count))) as daemon, open_ws(daemon) as client:
                thread_id = await new_thread(client, project(tmp_path), provider="claude")
                turn_id = (await client.call("turn.start", thread_id=thread_id, text="prompts galore"))["turn_id"]
                await wait_until(lambda: summary()["responses"] >= count - MAX_PENDING_REQUESTS, interval=0.1)
                await health_answers(daemon)
                pending = (await client.call("requests.pending", thread_id=thread_id))["requests"]
                assert len(pending) == MAX_PENDING_REQUESTS, len(pending)
                denied = summary()
                assert denied["behaviours"] == {"deny": count - MAX_PENDING_REQUESTS}, denied["behaviours"]
                assert denied["deny_messages"] == [
                    f"t3d: this turn already has {MAX_PENDING_REQUESTS} prompts waiting for an answer; "
                    "answer those first (requests.pending); this one was denied without asking"
                ]
                for request in pending:
                    await client.call("request.respond", request_id=request["id"], decision="allow")
                turn = await client.wait_event(
                    lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in ("completed", "failed", "interrupted", "cancelled")
                )
                assert turn["entity"]["status"] == "completed", turn
                await wait_until(lambda: summary()["responses"] == count, interval=0.1)  # written after the reply
                final = summary()
                assert final["answered"] == sorted(f"prompt_{n}" for n in range(count))
                assert final["behaviours"] == {"deny": count - MAX_PENDING_REQUESTS, "allow": MAX_PENDING_REQUESTS}
                assert (await client.call("requests.pending", thread_id=thread_id))["requests"] == []
                opened = await query(daemon.db_path, "SELECT count(*) FROM requests WHERE thread_id = ?", thread_id)
                assert opened == [(MAX_PENDING_REQUESTS,)]
    finally:
        kill_leftovers([], state)
