"""The `t3d` command line as a user runs it: help, and `t3d ctl` against a `t3d serve` subprocess.

One daemon (replay speed 0, and a "claude" that is a logged-out fake CLI)
serves the module; each `t3d ctl` call is a real process of the installed
console script.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
from harness import http

from t3d import __version__
from t3d.daemon import DaemonInfo

T3D = str(Path(sys.executable).parent / "t3d")
SERVING = re.compile(rb"t3d serving on http://127\.0\.0\.1:(\d+)")
THREAD_LINE = re.compile(r"^thread (\S+)$", re.MULTILINE)

# PROTOCOLS.md §1.5 C: what `claude` prints without credentials, then exit status 1.
LOGGED_OUT_CLAUDE = """#!/bin/sh
read -r first_message || true
cat <<'EOF'
{"type":"system","subtype":"init","cwd":"/workspace","session_id":"0b7e2b5e-7a8f-4f57-9d5c-1f1f1f1f1f1f","tools":[],"mcp_servers":[],"model":"claude-opus-4-8[1m]","permissionMode":"default","apiKeySource":"none","claude_code_version":"2.1.197","output_style":"default","uuid":"3e0c6a47-0000-4000-8000-000000000001"}
{"type":"system","subtype":"status","status":"requesting","uuid":"3e0c6a47-0000-4000-8000-000000000002","session_id":"0b7e2b5e-7a8f-4f57-9d5c-1f1f1f1f1f1f"}
{"type":"assistant","message":{"id":"b1a1c0de-0000-4000-8000-000000000003","container":null,"model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","stop_sequence":"","type":"message","usage":{"input_tokens":0,"output_tokens":0},"content":[{"type":"text","text":"Not logged in · Please run /login"}],"context_management":null},"parent_tool_use_id":null,"session_id":"0b7e2b5e-7a8f-4f57-9d5c-1f1f1f1f1f1f","uuid":"3e0c6a47-0000-4000-8000-000000000004","error":"authentication_failed"}
{"type":"result","subtype":"success","is_error":true,"api_error_status":null,"duration_ms":310,"duration_api_ms":0,"num_turns":1,"result":"Not logged in · Please run /login","stop_reason":"stop_sequence","session_id":"0b7e2b5e-7a8f-4f57-9d5c-1f1f1f1f1f1f","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","uuid":"3e0c6a47-0000-4000-8000-000000000005"}
EOF
exit 1
"""


@attrs.frozen
class Served:
    """A `t3d serve` subprocess; quacks like harness.Daemon for `http`."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    port: int
    log: Path

    @property
    def info(self) -> DaemonInfo:
        return DaemonInfo(
            f"http://127.0.0.1:{self.port}", self.port, str(self.state_dir / "auth" / "token")
        )

    @property
    def token(self) -> str:
        return (self.state_dir / "auth" / "token").read_text().strip()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_serve(root: Path, env: dict[str, str]) -> Served:
    """Start `t3d serve` on port 0 and wait (at most 15 s) for its "serving on" line.

    Blocking: call it from a fixture or a worker thread. Its stderr goes to a file, so
    the daemon never blocks on a pipe nobody drains.
    """
    state, log = root / "state", root / "serve.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [T3D, "serve", "--state-dir", str(state), "--port", "0", "--replay-speed", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
    deadline = time.monotonic() + 15
    while not (match := SERVING.search(log.read_bytes())):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"t3d serve did not start:\n{log.read_text()}")
        time.sleep(0.02)
    return Served(process, state, int(match.group(1)), log)


def clean_env(**extra: str) -> dict[str, str]:
    """No T3D_ settings but one: agents stop with their daemon (none is left for later tests)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
    return {**env, "T3D_AGENT_REATTACH_WINDOW": "0", **extra}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("cli")
    claude = root / "claude-logged-out"
    claude.write_text(LOGGED_OUT_CLAUDE)
    claude.chmod(0o755)
    served = start_serve(root, clean_env(T3D_CLAUDE_BIN=str(claude)))
    yield served
    assert served.stop() == 0


@attrs.frozen
class Ran:
    status: int
    out: str
    err: str

    def json_lines(self) -> list[Any]:
        return [orjson.loads(line) for line in self.out.splitlines()]


async def t3d(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
    done = await trio.run_process(
        [T3D, *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env or clean_env(),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    return Ran(done.returncode, done.stdout.decode(), done.stderr.decode())


async def ctl(daemon: Served, *args: str, cwd: Path | None = None) -> Ran:
    """`t3d ctl` pointed at ``daemon`` with the common flags (before the subcommand)."""
    return await t3d("ctl", "--state-dir", str(daemon.state_dir), "--port", str(daemon.port), *args, cwd=cwd)


async def test_help_names_the_commands_and_flags() -> None:
    """`t3d --help`, `t3d serve --help`, `t3d ctl --help`, `t3d ctl run --help`, `t3d service
    --help` and `t3d service install --help` exit 0 and mention their commands and flags; `t3d ctl --help` lists the exit statuses."""
    expected = {
        (): ["serve", "ctl", "schema", "service", "T3D_PORT"],
        ("serve",): [
            "--state-dir",
            "--port",
            "--replay-speed",
            "--log-level",
            "--claude-bin",
            "T3D_STATE_DIR",
        ],
        ("ctl",): ["status", "threads", "run", "attach", "log", "new", "diff", "completion", "shutdown", "--state-dir", "--port", "--json", "exit status:"],
        ("service",): ["install", "uninstall", "status", "logs"],
        ("service", "install"): ["--state-dir", "--env-file", "--dry-run"],
        ("ctl", "run"): ["--provider", "--project", "--thread", "--approve", "--json"],
    }
    results: dict[tuple[str, ...], Ran] = {}

    async def show(words: tuple[str, ...]) -> None:
        results[words] = await t3d(*words, "--help")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for words in expected:
                nursery.start_soon(show, words)
    for words, needles in expected.items():
        ran = results[words]
        assert ran.status == 0, (words, ran.err)
        for needle in needles:
            assert needle in ran.out, (words, needle)


async def test_ctl_run_streams_turns_and_answers_approvals(daemon: Served, tmp_path: Path) -> None:
    """`t3d ctl run --provider replay --project DIR "hello"` exits 0 printing the assistant's text
    and the new thread's id; `--thread ID --approve none` denies turn 2's Edit and still exits 0
    (the recorded turn completes); `--approve all --json` allows turn 3's Bash and prints JSON
    lines ending with the completed turn."""
    with trio.fail_after(30):
        first = await ctl(
            daemon, "run", "--provider", "replay", "--project", str(tmp_path), "hello"
        )
        assert first.status == 0, first.err
        assert "I'll read the file." in first.out
        assert "Done. The tool returned" in first.out
        [thread_id] = THREAD_LINE.findall(first.err)

        second = await ctl(
            daemon, "run", "--thread", thread_id, "--approve", "none", "Now EDIT notes.txt"
        )
        assert second.status == 0, second.err
        assert "no (--approve none)" in second.out

        third = await ctl(
            daemon,
            "run",
            "--thread",
            thread_id,
            "--approve",
            "all",
            "--json",
            "Now run BASH to create a file",
        )
        assert third.status == 0, third.err
        assert "yes (--approve all)" in third.err  # with --json, stdout is JSON only
        lines = third.json_lines()
        assert lines[-1]["turn"]["status"] == "completed"
        assert lines[-1]["turn"]["ordinal"] == 3
        assert all(
            line["entity"]["turn_id"] == lines[-1]["turn"]["id"]
            for line in lines[:-1]
            if line["kind"] == "item.updated"
        )

        status, snapshot = await http(daemon, "GET", f"/api/threads/{thread_id}")  # type: ignore[arg-type]
        assert status == 200
        assert [t["status"] for t in snapshot["turns"]] == ["completed"] * 3
        approvals = [i["status"] for i in snapshot["items"] if i["kind"] == "approval_request"]
        assert approvals == ["denied", "allowed"]


def readme_demo_output(thread_id: str, state_dir: Path) -> list[str]:
    """The lines the README shows for its first `t3d ctl run --provider replay` command, with
    its thread id and state dir replaced by these."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    after = readme.split('t3d ctl run --provider replay "Please READ notes.txt"\n```\n\n```\n', 1)[1]
    block = after.split("\n```", 1)[0]
    [shown_id] = THREAD_LINE.findall(block)
    return block.replace(shown_id, thread_id).replace("/home/you/.local/state/t3d", str(state_dir)).splitlines()


async def test_the_replay_demo_runs_in_a_scratch_project_and_says_it_plays_a_recording(
    daemon: Served, tmp_path: Path
) -> None:
    """The README's `t3d ctl run --provider replay "..."`, run inside a git repository, leaves
    that repository alone (no project, no checkpoint refs): the turn runs in
    <state dir>/replay-demo, seeded with the notes.txt the recording reads, and says so. The
    run notes once that the replay ignores the prompt and the answers; results are labelled as
    recorded, and the recorded edit changes the scratch notes.txt even when denied here. The
    first run prints exactly what the README shows."""
    repo = tmp_path / "clone"
    repo.mkdir()
    await trio.run_process(["git", "init", "-q", str(repo)])
    scratch = daemon.state_dir / "replay-demo"
    with trio.fail_after(60):
        first = await ctl(daemon, "run", "--provider", "replay", "Please READ notes.txt", cwd=repo)
        assert first.status == 0, first.err
        assert f"note: the replay runs in a scratch project, {scratch} (--project DIR runs it elsewhere)" in first.err
        assert first.err.count("note: replay plays a recorded Claude Code session: it ignores your prompt") == 1
        [thread_id] = THREAD_LINE.findall(first.err)
        shown = readme_demo_output(thread_id, daemon.state_dir)
        on_stderr = [line for line in shown if line.startswith(("note: ", "thread "))]
        assert first.err.splitlines() == on_stderr  # the README shows what the run prints
        assert first.out.splitlines() == [line for line in shown if line not in on_stderr]
        second = await ctl(daemon, "run", "--thread", thread_id, "--approve", "none", "Now EDIT notes.txt", cwd=repo)
        assert second.status == 0, second.err
        assert "⏺ Edit(notes.txt)" in second.out  # shortened against the thread's project
        assert "  ⎿  Denied (the replay goes on as recorded either way)" in second.out
        assert "  ⎿  recorded: The file " in second.out
        refs = await trio.run_process(["git", "-C", str(repo), "for-each-ref", "refs/t3d"], capture_stdout=True)
        assert refs.stdout == b""
        _, projects = await http(daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": "project.list"})  # type: ignore[arg-type]
    paths = [p["path"] for p in projects["result"]["projects"]]
    assert str(scratch) in paths and str(repo) not in paths
    assert (scratch / "notes.txt").read_text() == "hello, world\n"


async def test_ctl_status_and_threads(daemon: Served, tmp_path: Path) -> None:
    """`t3d ctl status` reports the daemon's version, URL and health; `t3d ctl threads` lists
    the threads in a table (by their short ids); both have a `--json` form."""
    with trio.fail_after(20):
        created = []
        for method, params in (
            ("project.create", {"path": str(tmp_path)}),
            ("thread.create", {"provider": "replay", "title": "listed by ctl"}),
        ):
            if created:
                params["project_id"] = created[0]["project_id"]
            _, reply = await http(
                daemon,
                "POST",
                "/api/dispatch",
                {"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
            )  # type: ignore[arg-type]
            created.append(reply["result"])
        thread_id = created[1]["thread_id"]

        results: dict[str, Ran] = {}

        async def run(name: str, *args: str) -> None:
            results[name] = await ctl(daemon, *args)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "status", "status")
            nursery.start_soon(run, "status --json", "status", "--json")
            nursery.start_soon(run, "threads", "threads")
            nursery.start_soon(run, "threads --json", "threads", "--json")
    for name, ran in results.items():
        assert ran.status == 0, (name, ran.err)
    assert f"t3d {__version__} at http://127.0.0.1:{daemon.port}: ok" in results["status"].out
    report = orjson.loads(results["status --json"].out)
    assert report["health"]["status"] == "ok" and report["threads"] >= 1 and report["projects"] >= 1
    assert results["threads"].out.split()[:9] == ["ID", "PROJECT", "PROVIDER", "STATUS", "FOR", "LAST", "TURN", "TURNS", "TITLE"]
    assert thread_id[:8] in results["threads"].out and "listed by ctl" in results["threads"].out
    rows = orjson.loads(results["threads --json"].out)
    assert thread_id in [row["id"] for row in rows]


async def test_ctl_run_reports_a_logged_out_claude(daemon: Served, tmp_path: Path) -> None:
    """With `claude` logged out (the fake prints PROTOCOLS.md §1.5's lines and exits 1),
    `t3d ctl run --provider claude` exits non-zero and prints "Not logged in · Please run
    /login"; the daemon stays healthy."""
    with trio.fail_after(20):
        ran = await ctl(daemon, "run", "--provider", "claude", "--project", str(tmp_path), "hello")
        assert ran.status == 1, ran.err
        assert "Not logged in · Please run /login" in ran.out + ran.err
        [thread_id] = THREAD_LINE.findall(ran.err)
        status, snapshot = await http(daemon, "GET", f"/api/threads/{thread_id}")  # type: ignore[arg-type]
        assert snapshot["turns"][-1]["status"] == "failed"
        assert "Not logged in" in snapshot["turns"][-1]["error"]
        status, health = await http(daemon, "GET", "/api/health", token=False)  # type: ignore[arg-type]
        assert (status, health["status"]) == (200, "ok")
        assert daemon.process.poll() is None


async def test_ctl_status_says_how_to_start_a_stopped_daemon(tmp_path: Path) -> None:
    """Once `t3d serve` has stopped, `t3d ctl status` on its state dir and port exits 2 with a
    message saying no daemon answers and how to start one."""
    with trio.fail_after(30):
        served = await trio.to_thread.run_sync(start_serve, tmp_path, clean_env())
        assert await trio.to_thread.run_sync(served.stop) == 0
        ran = await ctl(served, "status")
    assert ran.status == 2
    assert f"no t3d daemon answers at http://127.0.0.1:{served.port}" in ran.err
    assert "start it with `t3d serve`" in ran.err


async def test_serve_tunes_the_collector_and_health_shows_its_pauses(daemon: Served) -> None:
    """`t3d serve` froze its start-up objects and raised the young threshold to 10,000
    (t3d/gc_tuning.py); /api/health reports the thresholds and, per generation, the
    collections and their pauses."""
    status, health = await http(daemon, "GET", "/api/health")  # type: ignore[arg-type]
    assert status == 200
    gc_report = health["gc"]
    assert gc_report["threshold"][0] == 10_000
    assert gc_report["frozen_objects"] > 1000
    assert [sorted(g) for g in gc_report["generations"]] == [["collections", "pause_ms_max", "pause_ms_total"]] * 3
