"""The real Claude Code CLI, logged out, through the daemon (when it is installed).

.ci/run installs `@anthropic-ai/claude-code` from npm and points
T3D_TEST_CLAUDE_BIN at it; elsewhere a `claude` on PATH is used, and without
one the test is skipped. The CLI runs with an empty HOME and no API key, so
it is logged out whatever the machine has.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio
from harness import http, new_thread, open_client, run_turn, start_daemon

CLAUDE = os.environ.get("T3D_TEST_CLAUDE_BIN") or shutil.which("claude")


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code is not installed (set T3D_TEST_CLAUDE_BIN)")
async def test_a_logged_out_claude_fails_the_turn_with_its_own_message(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn fails within 30 s with 'Not logged in · Please run /login'; the daemon stays healthy."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    monkeypatch.setenv("DISABLE_AUTOUPDATER", "1")
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=CLAUDE)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, provider="claude")
            outcome = await run_turn(client, thread_id, "hi")
        assert outcome.turn["status"] == "failed"
        assert outcome.turn["error"] == "Not logged in · Please run /login"
        status, health = await http(daemon, "GET", "/api/health", token=False)
        assert status == 200 and health["status"] == "ok"
        daemon.stop()
