"""Provider processes that misbehave: the daemon ends the turn with a clear reason and goes on.

Each fake is `tests/fixtures/misbehaving_claude`, a real subprocess speaking the real
stream-json protocol, started as the ``claude`` provider through a one-line wrapper
written to ``tmp_path`` (the daemon runs ``claude_bin`` as argv[0], and the wrapper pins
the interpreter to this test run's Python). The resume test uses the replay fake.
"""

from __future__ import annotations

import itertools
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import (
    FIXTURES,
    TEST_FIXTURES,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
)

Json = dict[str, Any]

MISBEHAVING = TEST_FIXTURES / "misbehaving_claude"
DEFAULT_FIXTURE = FIXTURES / "claude-2.1.197_multiturn_tools.jsonl"
COALESCE_S = 0.05  # the session's stated bound: one streaming update per item per 50 ms


def fake_claude(tmp_path: Path, mode: str) -> tuple[str, Path]:
    """A `claude` binary in ``mode`` (first launch only) and its launch counter file."""
    state = tmp_path / f"{mode}.launches"
    script = tmp_path / f"claude-{mode}"
    script.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' '{MISBEHAVING}' --mode {mode} --state '{state}' \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), state


def sessions(seen: list[Json]) -> dict[str, Json]:
    """The last state of each provider session, by session id, in order of first appearance."""
    latest: dict[str, Json] = {}
    for data in seen:
        if data["kind"] == "session.updated":
            latest[data["entity"]["id"]] = data["entity"]
    return latest


async def assert_healthy(daemon: Any) -> None:
    status, body = await http(daemon, "GET", "/api/health", token=False)
    assert status == 200, body


def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir(exist_ok=True)
    return path.resolve()


async def test_an_interrupt_the_provider_ignores_is_enforced(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI that never answers an interrupt is stopped after `interrupt_timeout`: the turn ends
    `interrupted` (reason `interrupt_timeout`) within seconds, and the next turn runs on a new process."""
    with trio.fail_after(15):
        binary, launches = fake_claude(tmp_path, "ignore-interrupt")
        daemon = await start_daemon(
            nursery, tmp_path / "state", claude_bin=binary, interrupt_timeout=0.5
        )
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            asked_at: list[float] = []

            async def interrupt_once_streaming(data: Json) -> None:
                if (
                    data["kind"] == "item.updated"
                    and data["entity"]["kind"] == "assistant_message"
                    and not asked_at
                ):
                    asked_at.append(trio.current_time())
                    await client.call("turn.interrupt", thread_id=thread_id)

            outcome = await run_turn(
                client, thread_id, "count forever", on_event=interrupt_once_streaming
            )
            took = trio.current_time() - asked_at[0]
            assert outcome.turn["status"] == "interrupted"
            assert outcome.turn["reason"] == "interrupt_timeout"
            assert "0.5" in outcome.turn["error"], outcome.turn["error"]
            assert 0.5 <= took < 4.0, f"the interrupt took {took:.2f} s to enforce"
            assert all(i["status"] not in ("streaming", "running") for i in outcome.items)

            again = await run_turn(client, thread_id, "are you back")
            assert again.turn["status"] == "completed"
            assert again.assistant_text == ["ok: are you back"]
        first, second = sessions(seen).values()
        assert first["status"] == "exited" and first["pid"] != second["pid"]
        assert second["status"] == "running"
        assert launches.read_text() == "2"
        await assert_healthy(daemon)
        daemon.stop()


async def test_a_provider_crash_fails_the_turn_with_its_stderr(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI that dies mid-turn fails the turn with its exit status and last stderr line, and its
    session is recorded as exited with that exit code and stderr tail."""
    with trio.fail_after(15):
        binary, _ = fake_claude(tmp_path, "crash")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "please crash")
            assert outcome.turn["status"] == "failed"
            assert outcome.turn["reason"] == "provider_exited"
            assert "status 3" in outcome.turn["error"], outcome.turn["error"]
            assert "boom: out of cheese" in outcome.turn["error"]
            (session,) = sessions(seen).values()
            assert session["status"] == "exited"
            assert session["exit_code"] == 3
            assert "boom: out of cheese" in session["stderr_tail"]

            again = await run_turn(
                client, thread_id, "and now"
            )  # a new process (second launch is normal)
            assert again.turn["status"] == "completed"
        await assert_healthy(daemon)
        daemon.stop()


async def test_a_missing_binary_fails_the_turn_quickly(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A `claude_bin` that does not exist fails the turn at once with an error naming the binary
    and how to install it; the daemon stays healthy and the thread takes another turn (which
    fails the same way)."""
    with trio.fail_after(10):
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin="/nonexistent/claude")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            started = trio.current_time()
            outcome = await run_turn(client, thread_id, "hello")
            assert trio.current_time() - started < 2.0
            assert outcome.turn["status"] == "failed"
            assert "/nonexistent/claude" in outcome.turn["error"], outcome.turn["error"]
            assert "npm i -g @anthropic-ai/claude-code" in outcome.turn["error"]
            await assert_healthy(daemon)
            again = await run_turn(client, thread_id, "hello again")
            assert again.turn["status"] == "failed"
            assert "/nonexistent/claude" in again.turn["error"]
        daemon.stop()


async def test_malformed_provider_lines_are_skipped(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Lines that are not JSON, not objects, mistyped, empty, 2 MB of an unknown type or not
    UTF-8 are skipped: the turn completes with the text of the valid lines around them."""
    with trio.fail_after(15):
        binary, _ = fake_claude(tmp_path, "garbage")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "survive this")
            assert outcome.turn["status"] == "completed", outcome.turn
            assert outcome.assistant_text == ["ok: survive this"]
            assert [i["kind"] for i in outcome.items] == ["user_message", "assistant_message"]
            await assert_healthy(daemon)
            again = await run_turn(client, thread_id, "still there")  # the same process goes on
            assert again.assistant_text == ["ok: still there"]
        daemon.stop()


async def test_a_flood_of_deltas_is_coalesced(tmp_path: Path, nursery: trio.Nursery) -> None:
    """20,000 text deltas written as fast as possible end in the exact concatenated text, with
    at most one streaming update per item per 50 ms (plus the final one), not one per delta."""
    with trio.fail_after(30):
        binary, _ = fake_claude(tmp_path, "flood")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            started = trio.current_time()
            outcome = await run_turn(client, thread_id, "flood")
            took = trio.current_time() - started
        assert outcome.turn["status"] == "completed"
        assert outcome.assistant_text == ["".join(f"{n};" for n in range(20_000))]
        (item,) = outcome.of_kind("assistant_message")
        updates = [
            e
            for e in outcome.events
            if e["kind"] == "item.updated" and e["entity"]["id"] == item["id"]
        ]
        # Streaming updates are spaced at least COALESCE_S apart, so over the turn's wall time
        # there can be at most took / COALESCE_S of them, plus the final state (and one at the
        # start, before any spacing applies). 2,000 would already be a 10x coalescing failure.
        assert len(updates) <= took / COALESCE_S + 2, (len(updates), took)
        assert len(updates) < 2_000
        assert updates[-1]["entity"]["status"] == "completed"
        texts = [u["entity"]["text"] for u in updates]
        assert all(b.startswith(a) for a, b in itertools.pairwise(texts)), (
            "streamed text went backwards"
        )
        daemon.stop()


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def recorded_session_id(recording: Path) -> str:
    for raw in recording.read_text().splitlines():
        line = json.loads(raw.removeprefix(">>> "))
        if line.get("type") == "system" and line.get("subtype") == "init":
            return str(line["session_id"])
    raise AssertionError(f"{recording} has no init line")


@pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="reads the provider's argv from /proc"
)
async def test_a_restarted_daemon_resumes_the_native_session(tmp_path: Path) -> None:
    """After a daemon restart the thread's next turn starts the CLI with `--resume <id>`, where
    the id is the session id the CLI reported (in `init`) for the turn before the restart."""
    with trio.fail_after(20):
        native = recorded_session_id(DEFAULT_FIXTURE)
        state = tmp_path / "state"
        async with trio.open_nursery() as first:
            daemon = await start_daemon(first, state)
            async with open_client(daemon) as client:
                seen = client.record_events()
                thread_id = await new_thread(client, project(tmp_path))
                before = await run_turn(client, thread_id, "Please READ notes.txt")
                assert before.turn["status"] == "completed"
            (old,) = sessions(seen).values()
            assert "--resume" not in cmdline(old["pid"])
            daemon.stop()

        async with trio.open_nursery() as second:
            daemon = await start_daemon(second, state)
            async with open_client(daemon) as client:
                seen = client.record_events()
                await client.call("subscribe.thread", thread_id=thread_id)
                after = await run_turn(client, thread_id, "Please READ notes.txt")
                assert after.turn["status"] == "completed"
                (new,) = sessions(seen).values()
                assert new["native_session_id"] == native
                argv = cmdline(new["pid"])
                assert argv[argv.index("--resume") + 1] == native, argv
            daemon.stop()


async def test_a_provider_that_exits_without_a_result_fails_the_turn(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI that exits 0 right after `init`, with no `result`, fails the turn (reason
    `provider_exited`) instead of leaving it running."""
    with trio.fail_after(10):
        binary, _ = fake_claude(tmp_path, "exit-after-init")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "hello")
            assert outcome.turn["status"] == "failed"
            assert outcome.turn["reason"] == "provider_exited"
            assert "status 0" in outcome.turn["error"], outcome.turn["error"]
            await assert_healthy(daemon)
        daemon.stop()


async def test_a_bare_result_line_fails_the_turn_with_a_clear_error(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI that ends the turn with a bare ``{"type":"result"}`` (no subtype, no text) fails
    it with an error saying so and a reason that is not empty; the next turn runs."""
    with trio.fail_after(20):
        binary, _ = fake_claude(tmp_path, "bare-result")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "hello")
            assert outcome.turn["status"] == "failed"
            assert outcome.turn["error"] == "claude ended the turn with a result line that carries no subtype or text"
            assert outcome.turn["reason"] == "result_without_subtype"
            assert (await run_turn(client, thread_id, "again")).turn["status"] == "completed"
            await assert_healthy(daemon)
        daemon.stop()


async def test_stderr_that_outlives_the_process_still_explains_the_exit(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The exit report waits (bounded) for stderr to close, so lines still in flight when the
    exit status arrives (here written by the CLI's child after the CLI exited) end the error."""
    with trio.fail_after(10):
        binary, _ = fake_claude(tmp_path, "crash-late-stderr")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "please crash")
        assert outcome.turn["status"] == "failed"
        assert outcome.turn["error"].endswith(
            "status 3 before the turn finished: boom: out of cheese"
        ), outcome.turn["error"]
        (session,) = sessions(seen).values()
        assert session["stderr_tail"].endswith("boom: out of cheese")
        assert len(session["stderr_tail"]) <= 8 * 1024  # only the tail is kept
        daemon.stop()


async def test_a_cli_that_exits_while_its_grandchild_holds_stdout_ends_its_turn(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The exit of the provider process ends the turn, not EOF on a pipe a detached
    grandchild still holds (`sleep 90` here): the turn fails `provider_exited` within
    seconds, and the thread's next turn runs on a new process instead of queueing."""
    with trio.fail_after(30):
        binary, _ = fake_claude(tmp_path, "orphan-grandchild")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            with trio.fail_after(10):
                outcome = await run_turn(client, thread_id, "start a helper")
            assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_exited")
            assert "status 1" in outcome.turn["error"], outcome.turn["error"]
            after = await run_turn(client, thread_id, "hello again")
            assert after.turn["status"] == "completed"
            assert after.assistant_text == ["ok: hello again"]
        daemon.stop()
    _kill_sleepers(tmp_path)


def _kill_sleepers(tmp_path: Path) -> None:
    """The test's `sleep 90` grandchildren (started in the project directory)."""
    import os
    import signal as signals

    cwd = str(project(tmp_path))
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                name = comm.read().strip()
            if name == "sleep" and os.readlink(f"/proc/{pid}/cwd") == cwd:
                os.kill(pid, signals.SIGKILL)
        except OSError:
            pass


async def test_a_silent_provider_fails_its_turn_after_the_silence_timeout(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A CLI that sends nothing more mid-turn and never exits: after `turn_silence_timeout`
    the turn fails (reason `provider_silent`, an error naming the setting), the process is
    stopped, and the next turn runs on a new one."""
    with trio.fail_after(30):
        binary, _ = fake_claude(tmp_path, "silent")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary, turn_silence_timeout=1)
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "think hard")
            assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_silent")
            assert "sent nothing for 1 s" in outcome.turn["error"]
            assert "--turn-silence-timeout" in outcome.turn["error"]
            after = await run_turn(client, thread_id, "hello")
            assert after.turn["status"] == "completed"
            assert len(sessions(seen)) == 2  # the silent process was stopped, a new one answered
        daemon.stop()


async def test_a_flood_of_garbage_lines_logs_a_few_warnings_and_a_summary(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """20,000 malformed provider lines in one turn: the first few are logged, the rest are
    counted into one summary line (not a warning per line), and the turn still completes."""
    with trio.fail_after(60):
        binary, _ = fake_claude(tmp_path, "garbage-flood")
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="claude")
            outcome = await run_turn(client, thread_id, "flood")
            assert outcome.turn["status"] == "completed"
            assert outcome.assistant_text == ["ok: flood"]
        daemon.stop()
    provider = [r for r in caplog.records if r.name == "t3d.providers.claude" and thread_id in r.getMessage()]
    assert 5 <= len(provider) <= 7, [r.getMessage()[:80] for r in provider]
    summaries = [r.getMessage() for r in provider if "more like that" in r.getMessage()]
    assert len(summaries) == 1 and "19995 more like that" in summaries[0], summaries
