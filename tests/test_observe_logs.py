"""What the daemon logs for a person running it: turns, agents, loop stalls; text or JSON.

A stall over `--loop-stall-threshold` (a task that blocks the loop with time.sleep) logs
one record with its length, the blocking task's step, RSS, GC state and the writer queue;
a turn logs its start and end, an agent its start, with the facts as fields; `t3d serve
--log-format json` writes every line of stderr as one JSON object.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio_websocket
from harness import RpcClient, new_thread, open_client, run_turn, start_daemon, wait_until
from served import base_env

from t3d.observe.logs import JsonFormatter, record_fields


def _records(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


async def test_a_loop_stall_logs_one_record_with_the_daemons_state(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """A task that holds the loop for 0.8 s (threshold 0.3 s) gets one warning naming the
    stall's length and that task's step, with the daemon's RSS, GC collections and last
    pause, and the writer queue, as text and as fields (a JSON line carries them all)."""
    caplog.set_level(logging.WARNING, logger="t3d.loop")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", loop_stall_threshold=0.3)
        await trio.sleep(0.2)  # the monitor's first samples

        async def hold_the_loop() -> None:
            time.sleep(0.8)  # noqa: ASYNC251 -- blocking the loop is the point

        nursery.start_soon(hold_the_loop, name="stall-blocker")

        def ours() -> list[logging.LogRecord]:
            return [r for r in _records(caplog, "loop_stall") if any(s["task"] == "stall-blocker" for s in r.slowest_steps)]

        await wait_until(lambda: ours())
        daemon.stop()
    [record] = ours()
    assert record.levelno == logging.WARNING
    assert 0.5 <= record.stall_s < 5
    assert record.slowest_steps[0] == {"task": "stall-blocker", "ms": pytest.approx(800, abs=300)}
    assert record.rss_bytes > 10 * 2**20
    assert len(record.gc["collections"]) == 3
    assert set(record.writer) == {"queue", "oldest_job_s"}
    text = record.getMessage()
    assert text.startswith("the event loop stalled for ")
    assert "stall-blocker" in text and "MiB" in text and "GC collections" in text and "writer queue" in text
    line = orjson.loads(JsonFormatter().format(record))
    assert line["level"] == "warning" and line["logger"] == "t3d.loop" and line["message"] == text
    assert {"stall_s", "slowest_steps", "rss_bytes", "gc", "writer"} <= set(line)


async def test_turns_and_agents_log_their_start_and_end(
    tmp_path: Path, nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """A completed replay turn logs "started" and "completed after N s" with thread, turn,
    provider, outcome and duration as fields; its agent logs its start with its pid."""
    caplog.set_level(logging.INFO, logger="t3d.turns")
    caplog.set_level(logging.INFO, logger="t3d.agents")
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread = await new_thread(client, project)
            outcome = await run_turn(client, thread, "Please READ notes.txt")
        daemon.stop()
    turn = outcome.turn
    [started] = _records(caplog, "turn_started")
    [finished] = _records(caplog, "turn_finished")
    [agent] = _records(caplog, "agent_started")
    assert record_fields(started) == {"event": "turn_started", "thread_id": thread, "turn_id": turn["id"], "ordinal": 1, "provider": "replay"}
    fields = record_fields(finished)
    assert fields["outcome"] == "completed" and fields["provider"] == "replay" and fields["error"] is None
    assert fields["duration_s"] == pytest.approx(turn["completed_at"] - turn["started_at"], abs=0.01)
    assert finished.getMessage().startswith(f"thread {thread}: turn 1 ({turn['id']}) completed after ")
    assert agent.pid > 0 and agent.provider == "replay" and agent.thread_id == thread


async def test_serve_with_log_format_json_writes_only_json_lines(tmp_path: Path) -> None:
    """`t3d serve --log-format json`: every stderr line (the daemon's and the spawner's) is
    one JSON object with time, level, logger and message; the "serving" record carries the
    URL, and a turn's start and end come as turn_started and turn_finished records."""
    project = tmp_path / "project"
    project.mkdir()
    argv = [sys.executable, "-m", "t3d", "serve", "--port", "0", "--replay-speed", "0",
            "--state-dir", str(tmp_path / "state"), "--log-format", "json"]  # fmt: skip
    lines: list[dict[str, Any]] = []
    raw = bytearray()
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=base_env())
        try:
            async with trio.open_nursery() as nursery:

                async def read() -> None:
                    assert process.stderr is not None
                    async for chunk in process.stderr:
                        raw.extend(chunk)
                        *done, rest = raw.split(b"\n")
                        raw[:] = rest
                        lines.extend(orjson.loads(line) for line in done if line)

                nursery.start_soon(read)
                await wait_until(lambda: any(line.get("event") == "serving" for line in lines))
                url = next(line["url"] for line in lines if line.get("event") == "serving")
                port = int(url.rsplit(":", 1)[1])
                token = (tmp_path / "state" / "auth" / "token").read_text().strip()
                async with trio_websocket.open_websocket(
                    "127.0.0.1", port, "/ws", use_ssl=False, extra_headers=[("Authorization", f"Bearer {token}")]
                ) as ws:
                    client = RpcClient(ws)
                    thread = await new_thread(client, project)
                    assert (await run_turn(client, thread, "Please READ notes.txt")).turn["status"] == "completed"
                await wait_until(lambda: any(line.get("event") == "turn_finished" for line in lines))
                process.send_signal(signal.SIGTERM)
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
    assert not raw.strip(), "a partial last line"
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    assert any(line["logger"] == "t3d.spawner" for line in lines)
    events = [line.get("event") for line in lines]
    assert "turn_started" in events and "turn_finished" in events and "agent_started" in events
