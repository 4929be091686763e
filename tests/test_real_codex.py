"""The real Codex CLI, logged out, through the daemon (when it is installed).

.ci/run installs `@openai/codex` 0.171.0 from npm and points T3D_TEST_CODEX_BIN at it;
elsewhere a `codex` on PATH is used, and without one the test is skipped. Codex runs with
an empty CODEX_HOME and no API key, so it is logged out whatever the machine has. Offline
(as here) Codex retries its connection without end (PROTOCOLS.md §2.6) until the daemon
stops the turn after --codex-retry-timeout; with a network it fails the turn itself. Either
way the turn fails with Codex's own words and the daemon carries on.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import http, new_thread, open_client, run_turn, start_daemon

CODEX = os.environ.get("T3D_TEST_CODEX_BIN") or shutil.which("codex")


@pytest.mark.skipif(CODEX is None, reason="Codex is not installed (set T3D_TEST_CODEX_BIN)")
async def test_a_logged_out_codex_fails_the_turn_with_its_own_message(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn fails within 60 s with the message of Codex's own error notice; the next turn
    is interrupted through turn/interrupt; the daemon stays healthy and another thread (the
    replay provider) completes a turn."""
    home = tmp_path / "codex-home"
    home.mkdir()
    monkeypatch.setenv("CODEX_HOME", str(home))
    for name in ("OPENAI_API_KEY", "CODEX_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", codex_bin=CODEX, codex_retry_timeout=3.0)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="codex")
            outcome = await run_turn(client, thread_id, "hi")
            assert outcome.turn["status"] == "failed", outcome.turn
            errors = [item["text"] for item in outcome.of_kind("error")]
            assert errors and any(outcome.turn["error"].startswith(text) for text in errors), (outcome.turn, errors)

            async def interrupt_on_first_error(data: dict[str, Any]) -> None:
                if data["kind"] == "item.updated" and data["entity"]["kind"] == "error" and not asked:
                    asked.append(True)
                    await client.call("turn.interrupt", thread_id=thread_id)

            asked: list[bool] = []
            again = await run_turn(client, thread_id, "hi again", on_event=interrupt_on_first_error)
            if asked:  # offline: Codex retried, and honoured the interrupt
                assert (again.turn["status"], again.turn["reason"]) == ("interrupted", "interrupt")

            status, health = await http(daemon, "GET", "/api/health", token=False)
            assert status == 200 and health["status"] == "ok"
            other = await new_thread(client, project, provider="replay")
            assert (await run_turn(client, other, "Please READ notes.txt")).turn["status"] == "completed"
        daemon.stop()
