"""Settings that name files are checked when `t3d serve` starts (t3d/startup_checks.py).

A provider binary named but missing from PATH is a warning (the daemon serves, replay works,
that provider's turns fail saying how to install it); a path given that cannot be run, or a
replay fixture that cannot be read, stops start-up with exit status 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from harness import new_thread, open_client, run_turn, start_daemon
from served import base_env, serve

from t3d.config import load_settings
from t3d.errors import ConfigError
from t3d.startup_checks import PROVIDER_BINARIES, check_settings, missing_binary

INSTALL = "npm i -g @anthropic-ai/claude-code"


def executable(path: Path, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


def test_a_relative_binary_path_is_made_absolute_and_a_name_is_kept() -> None:
    """`--claude-bin bin/claude` means the file under the directory `t3d serve` ran in (agents
    run in their thread's directory, so it is made absolute); a bare name stays a PATH lookup."""
    relative = load_settings({"state_dir": "/s", "claude_bin": "bin/claude"}, {})
    assert relative.claude_bin == os.path.join(os.getcwd(), "bin/claude")
    assert load_settings({"state_dir": "/s", "claude_bin": "claude-2"}, {}).claude_bin == "claude-2"
    with pytest.raises(ConfigError, match="--claude-bin is empty"):
        load_settings({"state_dir": "/s", "claude_bin": " "}, {})


def test_a_binary_missing_from_path_is_a_warning_with_the_fix(tmp_path: Path) -> None:
    """A provider binary given as a name that is not on PATH gives one warning naming it, how
    to install it and the setting that points at it; on PATH, nothing."""
    settings = load_settings({"state_dir": str(tmp_path)}, {})
    [warning, codex] = check_settings(settings, {"PATH": str(tmp_path)})
    assert "'claude' is not on PATH" in warning and INSTALL in warning
    assert "--claude-bin (or T3D_CLAUDE_BIN)" in warning and "replay provider works" in warning
    assert "'codex' is not on PATH" in codex and "npm i -g @openai/codex" in codex
    assert "--codex-bin (or T3D_CODEX_BIN)" in codex and "replay-codex provider works" in codex
    executable(tmp_path / "claude")
    executable(tmp_path / "codex")
    assert check_settings(settings, {"PATH": str(tmp_path)}) == []
    assert missing_binary("claude", settings, {"PATH": str(tmp_path)}) is None
    assert missing_binary("replay", settings, {"PATH": ""}) is None  # it runs no binary of its own
    assert missing_binary("replay-codex", settings, {"PATH": ""}) is None


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d / "absent", "No such file or directory"),
        (lambda d: executable(d / "plain", 0o644), "not executable"),
        (lambda d: d, "not a regular file"),
    ],
)
def test_a_binary_path_that_cannot_run_is_an_invalid_setting(tmp_path: Path, make: object, reason: str) -> None:
    """A provider binary given as a path that is missing, not executable or a directory is a
    ConfigError naming the setting, the path, why, and the fix."""
    path = make(tmp_path)  # type: ignore[operator]
    settings = load_settings({"state_dir": str(tmp_path), "claude_bin": str(path)}, {})
    with pytest.raises(ConfigError) as failed:
        check_settings(settings, {"PATH": ""})
    message = str(failed.value)
    assert message.startswith(f"--claude-bin (or T3D_CLAUDE_BIN)={str(path)!r} cannot be run ({reason})")
    assert INSTALL in message


def test_a_replay_fixture_that_cannot_be_read_is_an_invalid_setting(tmp_path: Path) -> None:
    """`--replay-fixture` naming a missing file or a directory is a ConfigError; a readable
    file passes."""
    for path, reason in ((tmp_path / "absent.jsonl", "No such file"), (tmp_path, "a directory")):
        settings = load_settings({"state_dir": str(tmp_path), "replay_fixture": str(path)}, {})
        with pytest.raises(ConfigError, match=reason) as failed:
            check_settings(settings, os.environ)
        assert "--replay-fixture (or T3D_REPLAY_FIXTURE)" in str(failed.value)
    fixture = tmp_path / "ok.jsonl"
    fixture.write_text("{}\n")
    check_settings(load_settings({"state_dir": str(tmp_path), "replay_fixture": str(fixture)}, {}), {"PATH": ""})


def test_every_provider_binary_names_a_setting() -> None:
    """Each row of PROVIDER_BINARIES names a Settings field with a flag and an env variable, so
    a provider that adds its row gets the checks and the messages."""
    defaults = load_settings({"state_dir": "/s"}, {})
    for binary in PROVIDER_BINARIES:
        assert isinstance(getattr(defaults, binary.setting), str), binary


async def test_serve_stops_with_status_2_for_a_binary_path_that_cannot_run(tmp_path: Path) -> None:
    """`t3d serve --claude-bin /nonexistent/claude` exits 2 with the usual invalid-setting line
    before it serves or starts anything (no spawner socket in the state dir)."""
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "t3d", "serve", "--port", "0", "--state-dir", str(tmp_path / "state"),
             "--claude-bin", "/nonexistent/claude"],
            stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
        )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("t3d: invalid setting: --claude-bin (or T3D_CLAUDE_BIN)='/nonexistent/claude' cannot be run")
    assert not (tmp_path / "state" / "spawner.sock").exists()


async def test_serve_warns_of_a_missing_binary_and_serves_replay(tmp_path: Path) -> None:
    """`t3d serve --claude-bin t3d-no-such-claude` logs one warning with the fix and serves:
    a replay turn completes."""
    with trio.fail_after(60):
        async with serve(tmp_path / "state", "--claude-bin", "t3d-no-such-claude") as served:
            assert "WARNING t3d: the claude CLI 't3d-no-such-claude' is not on PATH" in served.stderr_text()
            assert INSTALL in served.stderr_text()
            async with open_client(served) as client:  # type: ignore[arg-type]
                thread_id = await new_thread(client, tmp_path)
                outcome = await run_turn(client, thread_id, "Please READ notes.txt")
                assert outcome.turn["status"] == "completed", outcome.turn


async def test_a_claude_turn_without_the_binary_fails_saying_how_to_install_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """With no `claude` on PATH, a claude turn fails (provider_start_failed) with an error that
    says how to install it or which setting points at it, not only "No such file"."""
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin="t3d-no-such-claude")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, provider="claude")
            outcome = await run_turn(client, thread_id, "hello")
        assert outcome.turn["status"] == "failed"
        assert outcome.turn["reason"] == "provider_start_failed"
        error = outcome.turn["error"]
        assert error.startswith("claude: the claude CLI 't3d-no-such-claude' is not on PATH"), error
        assert INSTALL in error and "--claude-bin (or T3D_CLAUDE_BIN)" in error
        daemon.stop()
