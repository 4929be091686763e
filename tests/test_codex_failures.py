"""Codex app-server processes that misbehave: the daemon ends at most that turn, clearly, and goes on.

Each fake is `tests/fixtures/misbehaving_codex`, a real subprocess speaking the real
JSON-RPC protocol, started as the ``codex`` provider through a one-line wrapper written
to ``tmp_path`` (the daemon runs ``codex_bin app-server``). It misbehaves on its first
launch only, so each test also checks that the thread's next turn works.
"""

from __future__ import annotations

import logging
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import (
    TERMINAL,
    TEST_FIXTURES,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
    wait_until,
)

from t3d.domain.model import MAX_PENDING_REQUESTS
from t3d.providers.log_limit import BURST

Json = dict[str, Any]

MISBEHAVING = TEST_FIXTURES / "misbehaving_codex"


def fake_codex(tmp_path: Path, mode: str) -> str:
    """A `codex` binary in ``mode`` (first launch only)."""
    state = tmp_path / f"{mode}.launches"
    script = tmp_path / f"codex-{mode}"
    script.write_text(
        f"#!/bin/sh\nexec '{sys.executable}' '{MISBEHAVING}' --mode {mode} --state '{state}' \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def project(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir(exist_ok=True)
    return path.resolve()


def sessions(seen: list[Json]) -> dict[str, Json]:
    latest: dict[str, Json] = {}
    for data in seen:
        if data["kind"] == "session.updated":
            latest[data["entity"]["id"]] = data["entity"]
    return latest


async def assert_healthy(daemon: Any) -> None:
    status, body = await http(daemon, "GET", "/api/health", token=False)
    assert status == 200, body


async def one_bad_turn(tmp_path: Path, nursery: trio.Nursery, mode: str, **settings: Any) -> tuple[Any, list[Json], Any]:
    """A daemon whose codex misbehaves in ``mode``: the bad turn's outcome, the events seen,
    and the outcome of the thread's next turn (a new, well-behaved launch if the first died)."""
    daemon = await start_daemon(nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, mode), **settings)
    async with open_client(daemon) as client:
        seen = client.record_events()
        thread_id = await new_thread(client, project(tmp_path), provider="codex")
        outcome = await run_turn(client, thread_id, "misbehave")
        again = await run_turn(client, thread_id, "are you back")
        await assert_healthy(daemon)
    daemon.stop()
    return outcome, seen, again


async def test_a_crash_mid_turn_fails_the_turn_with_its_stderr(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Codex dying mid-turn fails the turn with its exit status and last stderr line (without
    its colour codes); the session is recorded exited; the next turn starts a new process."""
    with trio.fail_after(30):
        outcome, seen, again = await one_bad_turn(tmp_path, nursery, "crash")
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_exited")
    assert outcome.turn["error"].endswith("exited with status 3 before the turn finished: 2026-12-01T09:00:00Z ERROR boom: out of cheese")
    first, second = sessions(seen).values()
    assert first["status"] == "exited" and first["exit_code"] == 3 and "out of cheese" in first["stderr_tail"]
    assert second["status"] == "running" and second["pid"] != first["pid"]
    assert again.turn["status"] == "completed" and again.assistant_text == ["ok: are you back"]


async def test_garbage_unknown_methods_and_a_request_t3d_cannot_serve(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Invalid JSON, a JSON list, non-UTF-8 bytes and a 2 MB notification of an unknown method
    are skipped; an unknown item type is kept (its whole object in data); a server request t3d
    does not serve is answered with a JSON-RPC error at once (else the fake exits 4), and the
    turn completes in the same process."""
    with trio.fail_after(30):
        outcome, seen, again = await one_bad_turn(tmp_path, nursery, "garbage")
    assert outcome.turn["status"] == "completed", outcome.turn
    assert outcome.assistant_text == ["ok: misbehave"]
    (hologram,) = outcome.of_kind("tool_call")
    assert (hologram["title"], hologram["status"]) == ("hologram", "completed")
    assert hologram["data"]["codex"] == {"type": "hologram", "id": "h1", "beam": [1, 2, 3]}
    assert len(sessions(seen)) == 1
    assert again.assistant_text == ["ok: are you back"]


async def test_a_100_mb_line_fails_only_its_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A 100 MB stdout line cannot be read (the line limit is 32 MiB): the turn is interrupted
    and fails saying so (reason provider_line_too_long); the same process takes the next turn."""
    with trio.fail_after(60):
        outcome, seen, again = await one_bad_turn(tmp_path, nursery, "long-line")
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_line_too_long")
    assert "104857" in outcome.turn["error"] and "over t3d's limit" in outcome.turn["error"]
    assert len(sessions(seen)) == 1
    assert again.turn["status"] == "completed"


async def test_an_exit_without_turn_completed_fails_the_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Codex exiting 0 after turn/started, with no turn/completed, fails the turn (provider_exited)."""
    with trio.fail_after(30):
        outcome, _, again = await one_bad_turn(tmp_path, nursery, "exit-mid-turn")
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_exited")
    assert "status 0" in outcome.turn["error"]
    assert again.turn["status"] == "completed"


async def test_a_turn_codex_fails_ends_failed_with_codexs_message(tmp_path: Path, nursery: trio.Nursery) -> None:
    """turn/completed failed ends the turn failed with Codex's message and its error code as the
    reason; the error notice is a failed error item; the process goes on."""
    with trio.fail_after(30):
        outcome, seen, again = await one_bad_turn(tmp_path, nursery, "fail")
    message = "unexpected status 401 Unauthorized: Missing bearer authentication"
    assert (outcome.turn["status"], outcome.turn["error"], outcome.turn["reason"]) == ("failed", message, "unauthorized")
    assert [(i["status"], i["text"]) for i in outcome.of_kind("error")] == [("failed", message)]
    assert len(sessions(seen)) == 1 and again.turn["status"] == "completed"


async def test_a_refused_turn_start_fails_the_turn_with_codexs_answer(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A JSON-RPC error in answer to turn/start fails the turn (provider_refused) with Codex's words."""
    with trio.fail_after(30):
        outcome, _, again = await one_bad_turn(tmp_path, nursery, "refuse-turn")
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_refused")
    assert "codex refused turn/start: thread not found" in outcome.turn["error"]
    assert again.turn["status"] == "completed"


async def test_a_turn_that_only_retries_fails_with_codexs_message(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Codex retrying without end (willRetry errors only) is stopped after --codex-retry-timeout:
    the turn fails with Codex's last message and the setting's name, and the retries are one
    error item, not one per notice."""
    with trio.fail_after(30):
        outcome, _, again = await one_bad_turn(tmp_path, nursery, "retry-forever", codex_retry_timeout=1.0)
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_retrying")
    error = outcome.turn["error"]
    assert error.startswith("Reconnecting... waiting for network (Connection failed: error sending request)")
    assert "--codex-retry-timeout" in error
    (retrying,) = outcome.of_kind("error")
    assert retrying["data"]["attempts"] >= 5 and retrying["status"] == "failed"
    assert again.turn["status"] == "completed"


async def test_an_interrupt_codex_ignores_is_enforced(tmp_path: Path, nursery: trio.Nursery) -> None:
    """turn/interrupt that Codex never honours stops the process after interrupt_timeout: the
    turn ends interrupted (interrupt_timeout) and the next turn runs on a new process."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, "ignore-interrupt"), interrupt_timeout=0.5)
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="codex")

            async def interrupt_once(data: Json) -> None:
                if data["kind"] == "item.updated" and data["entity"]["kind"] == "assistant_message" and not seen_interrupt:
                    seen_interrupt.append(True)
                    await client.call("turn.interrupt", thread_id=thread_id)

            seen_interrupt: list[bool] = []
            outcome = await run_turn(client, thread_id, "count forever", on_event=interrupt_once)
            assert (outcome.turn["status"], outcome.turn["reason"]) == ("interrupted", "interrupt_timeout")
            assert all(i["status"] not in ("streaming", "running") for i in outcome.items)
            again = await run_turn(client, thread_id, "are you back")
            assert again.assistant_text == ["ok: are you back"]
        first, second = sessions(seen).values()
        assert first["status"] == "exited" and second["pid"] != first["pid"]
        daemon.stop()


async def test_a_missing_codex_binary_names_the_setting_and_how_to_install_it(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A codex_bin that does not exist fails the turn at once, naming the binary, --codex-bin,
    T3D_CODEX_BIN and `npm i -g @openai/codex`; the daemon stays healthy."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state", codex_bin="/nonexistent/codex")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            outcome = await run_turn(client, thread_id, "hello")
            await assert_healthy(daemon)
        daemon.stop()
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_start_failed")
    error = outcome.turn["error"]
    for words in ("/nonexistent/codex", "--codex-bin", "T3D_CODEX_BIN", "npm i -g @openai/codex"):
        assert words in error, error


async def test_a_silent_codex_fails_its_turn_after_the_silence_timeout(tmp_path: Path, nursery: trio.Nursery) -> None:
    """An app-server that sends nothing more mid-turn and never exits: after
    `turn_silence_timeout` the turn fails (reason provider_silent, the same error as
    Claude's, naming the setting), the process is stopped, and the next turn runs on a
    new one."""
    with trio.fail_after(30):
        outcome, seen, again = await one_bad_turn(tmp_path, nursery, "silent", turn_silence_timeout=1)
    assert (outcome.turn["status"], outcome.turn["reason"]) == ("failed", "provider_silent")
    assert outcome.turn["error"].endswith(
        "sent nothing for 1 s, so its process was stopped (--turn-silence-timeout); start a new turn to continue"
    )
    first, second = sessions(seen).values()
    assert first["status"] == "exited" and second["pid"] != first["pid"]
    assert again.turn["status"] == "completed" and again.assistant_text == ["ok: are you back"]


async def test_archiving_while_an_idle_codex_is_on_its_way_out_still_records_its_exit(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """The thread is archived after its idle app-server was told to stop (stdin closed) and
    before it has exited: the session waits for that exit and records it (exited, status
    0), rather than leaving the session `running` in the store for ever. It once did,
    whenever an archive (or a stop) met an idle stop."""
    marker = tmp_path / "slow-exit.launches.eof"
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, "slow-exit"), provider_idle_timeout=0.2
        )
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            assert (await run_turn(client, thread_id, "hello")).turn["status"] == "completed"
            await wait_until(marker.exists)  # the idle stop closed its stdin; it exits 1 s later
            await client.call("thread.archive", thread_id=thread_id)
            exited = await client.wait_event(
                lambda d: d["kind"] == "session.updated" and d["entity"]["status"] == "exited"
            )
        daemon.stop()
    assert exited["entity"]["exit_code"] == 0


async def test_a_codex_turn_waiting_on_an_approval_does_not_time_out(tmp_path: Path, nursery: trio.Nursery) -> None:
    """While an approval is pending the app-server is silent by right: with
    `turn_silence_timeout` 1 s, a turn that waits 4 s for its answer is still running on
    the same process, and completes once answered."""
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, "approval"), turn_silence_timeout=1)
        async with open_client(daemon) as client:
            seen = client.record_events()
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            turn_id = (await client.call("turn.start", thread_id=thread_id, text="misbehave"))["turn_id"]
            request = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending")
            await trio.sleep(4)  # the behaviour pinned: nothing happens for 4 timeouts
            ended = [d for d in seen if d["kind"] == "turn.updated" and d["entity"]["status"] in TERMINAL]
            assert ended == [], ended
            await client.call("request.respond", request_id=request["entity"]["id"], decision="allow")
            end = await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in TERMINAL
            )
            assert end["entity"]["status"] == "completed", end["entity"]
            assert [s["status"] for s in sessions(seen).values()] == ["running"]
        daemon.stop()


async def test_a_flood_of_garbage_lines_logs_a_few_warnings_and_a_summary(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """20,000 malformed app-server lines in one turn: the first few are logged, the rest are
    counted into one summary line (not a warning per line), and the turn still completes.
    Likewise at info for 100 server requests t3d refuses and 100 error answers to requests
    it never made."""
    caplog.set_level(logging.INFO, logger="t3d.providers.codex")
    with trio.fail_after(60):
        outcome, _, again = await one_bad_turn(tmp_path, nursery, "garbage-flood")
    assert outcome.turn["status"] == "completed" and outcome.assistant_text == ["ok: misbehave"]
    thread_id = outcome.turn["thread_id"]
    codex = [r for r in caplog.records if r.name == "t3d.providers.codex" and thread_id in r.getMessage()]
    warnings = [r.getMessage() for r in codex if r.levelno == logging.WARNING]
    assert 5 <= len(warnings) <= 7, [m[:80] for m in warnings]
    summaries = [m for m in warnings if "more like that" in m]
    assert len(summaries) == 1 and "19995 more like that" in summaries[0], summaries
    notes = [r.getMessage() for r in codex if r.levelno == logging.INFO and "refused" in r.getMessage()]
    assert 5 <= len(notes) <= 7, [m[:80] for m in notes]
    summaries = [m for m in notes if "more like that" in m]
    assert len(summaries) == 1 and "195 more like that" in summaries[0], summaries
    assert again.turn["status"] == "completed"


async def test_a_flood_of_codex_approvals_opens_at_most_the_bound(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """300 approvals in one Codex turn: MAX_PENDING_REQUESTS are pending (requests.pending),
    every other one is declined to Codex at once, the refusals are logged rate-limited (a
    few warnings naming the bound and one summary), health answers, and answering the
    pending ones lets the turn complete."""
    caplog.set_level(logging.WARNING, logger="t3d.providers.codex")
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", codex_bin=fake_codex(tmp_path, "approval-flood"))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project(tmp_path), provider="codex")
            turn_id = (await client.call("turn.start", thread_id=thread_id, text="approve all"))["turn_id"]
            # Written after every approval: once recorded, the daemon has read them all.
            await client.wait_event(lambda d: d["kind"] == "item.updated" and d["entity"].get("text") == "all asked")
            await assert_healthy(daemon)
            pending = (await client.call("requests.pending", thread_id=thread_id))["requests"]
            assert len(pending) == MAX_PENDING_REQUESTS, len(pending)
            for request in pending:
                await client.call("request.respond", request_id=request["id"], decision="allow")
            tally = await client.wait_event(lambda d: d["kind"] == "item.updated" and str(d["entity"].get("text")).startswith("declined="))
            end = await client.wait_event(
                lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in TERMINAL
            )
            assert end["entity"]["status"] == "completed", end["entity"]
        daemon.stop()
    assert tally["entity"]["text"] == f"declined={300 - MAX_PENDING_REQUESTS} accepted={MAX_PENDING_REQUESTS}"
    denials = [r.getMessage() for r in caplog.records if "without asking" in r.getMessage()]
    assert 1 < len(denials) <= BURST + 1, denials
    assert f"this turn already has {MAX_PENDING_REQUESTS} prompts waiting for an answer" in denials[0]
    assert "more like that" in denials[-1], denials
