"""`t3d ctl top`: a snapshot with --json, a live curses screen in a real terminal, q quits.

The daemon runs in-process; `t3d ctl top` runs as a real subprocess against it (in a
pseudo-terminal for the live screen).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import orjson
import trio
from harness import Daemon, new_thread, open_client, run_turn, start_daemon, wait_until

from t3d.ctl.top import render


def _argv(daemon: Daemon, *args: str) -> list[str]:
    return [sys.executable, "-m", "t3d", "ctl", "top", "--state-dir", str(daemon.settings.state_dir), "--port", str(daemon.info.port), *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}


async def test_top_json_shows_a_waiting_agent_with_its_turn_and_process(tmp_path: Path, nursery: trio.Nursery) -> None:
    """While a turn waits on a permission prompt, `ctl top --json` shows its agent waiting,
    with the turn's ordinal and time, the provider, and its process group's RSS and CPU
    from /proc, next to the daemon's health (loop lag, writer queue, memory pressure)."""
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread = await new_thread(client, project)
            assert (await run_turn(client, thread, "Please READ notes.txt")).turn["status"] == "completed"
            await client.call("turn.start", thread_id=thread, text="Now EDIT notes.txt")
            pending = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending")
            ran = await trio.run_process(_argv(daemon, "--json"), capture_stdout=True, capture_stderr=True, check=False, env=_env())
            await client.call("request.respond", request_id=pending["entity"]["id"], decision="allow")
        daemon.stop()
    assert ran.returncode == 0, ran.stderr.decode()
    shown = orjson.loads(ran.stdout)
    [agent] = shown["agents"]
    assert (agent["thread_id"], agent["provider"], agent["status"], agent["turn_ordinal"]) == (thread, "replay", "waiting", 2)
    assert agent["turn_s"] >= 0 and agent["rss_bytes"] > 1 << 20 and agent["cpu_s"] > 0 and agent["processes"] >= 1
    assert shown["daemon"]["rss_bytes"] > 10 << 20
    assert {"loop_lag_ms", "writer", "memory_pressure"} <= set(shown["health"])


async def test_top_draws_a_live_screen_in_a_terminal_and_q_quits(tmp_path: Path, nursery: trio.Nursery) -> None:
    """In a real pseudo-terminal, `ctl top` draws the daemon's lines and the agents' table,
    refreshes, and exits 0 when q is typed, giving the terminal back (xterm's rmcup)."""
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread = await new_thread(client, project)
            assert (await run_turn(client, thread, "Please READ notes.txt")).turn["status"] == "completed"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        try:
            process = await trio.lowlevel.open_process(
                _argv(daemon, "--interval", "0.2"), stdin=slave, stdout=slave, stderr=slave, env={**_env(), "TERM": "xterm"}
            )
        finally:
            os.close(slave)
        screen = bytearray()
        stream = trio.lowlevel.FdStream(master)
        try:

            async def read() -> None:
                with contextlib.suppress(trio.BrokenResourceError):  # EIO once the terminal's last user exits
                    while chunk := await stream.receive_some(65536):
                        screen.extend(chunk)

            async with trio.open_nursery() as inner:
                inner.start_soon(read)
                await wait_until(lambda: b"1 agent(s)" in screen and thread[:20].encode() in screen)
                await wait_until(lambda: re.search(rb"\d\.\d%", screen))  # refreshed: CPU % needs two readings
                await stream.send_all(b"q")
                assert await process.wait() == 0, screen.decode(errors="replace")[-2000:]
                inner.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                process.kill()
            await stream.aclose()
        daemon.stop()
    assert b"THREAD" in screen and b"writer queue" in screen and b"memory pressure" in screen
    assert screen.rstrip().endswith(b"\x1b[?1049l") or b"\x1b[?1049l" in screen[-64:], "the terminal was not given back"


async def test_top_without_a_terminal_says_to_use_json(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With stdout not a terminal, `ctl top` exits 2 and says to use --json."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        ran = await trio.run_process(_argv(daemon), stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False, env=_env())
        daemon.stop()
    assert ran.returncode == 2
    assert "--json" in ran.stderr.decode()


def test_render_puts_busy_agents_first_and_computes_cpu_between_refreshes() -> None:
    """A running agent comes before an idle one; CPU % is the group's CPU seconds used
    between two snapshots over the time between them; the header carries lag, writer
    queue, memory pressure and admission."""
    health = {
        "status": "ok", "version": "9", "uptime_s": 3700, "loop_lag_ms": {"p50": 0.2, "p99": 3.0, "max": 12.0},
        "writer": {"queue": 2, "oldest_job_s": 0.05}, "memory_pressure": {"level": "elevated"},
        "admission": {"state": "open", "active_turns": 1, "held_turns": 0}, "sessions": 2, "connections": 3,
    }  # fmt: skip

    def agent(pid: int, status: str, cpu: float) -> dict[str, object]:
        return {"thread_id": f"t{pid}", "provider": "replay", "status": status, "turn_s": 75.0 if status != "idle" else None,
                "pid": pid, "processes": 1, "rss_bytes": 50 * 2**20, "cpu_s": cpu}  # fmt: skip

    before = {"at": 100.0, "agents": [agent(1, "idle", 1.0), agent(2, "running", 10.0)], "daemon": {"pid": 9, "rss_bytes": 2**27, "cpu_s": 5.0}}
    after = {"at": 102.0, "agents": [agent(1, "idle", 1.0), agent(2, "running", 11.0)], "daemon": {"pid": 9, "rss_bytes": 2**27, "cpu_s": 5.5}}
    lines = render("http://x", health, after, before)
    assert lines[0].startswith("t3d 9 at http://x  ok  up 1h 1m") and lines[0].endswith("CPU 25.0%")
    assert "p99 3.0 ms" in lines[1] and "writer queue 2" in lines[1] and "memory pressure elevated" in lines[1]
    assert "admission open" in lines[2]
    table = lines[lines.index(next(line for line in lines if line.startswith("THREAD"))) + 1 :]
    assert table[0].split() == ["t2", "replay", "running", "1m", "15s", "2", "1", "50.0", "MiB", "50.0%"]
    assert table[1].split()[:3] == ["t1", "replay", "idle"] and table[1].endswith("0.0%")
    assert render("http://x", health, after)[0].endswith("CPU —")
