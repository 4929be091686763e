"""Helpers for the tests that drive `t3d ctl` subprocesses against a `t3d serve` subprocess:
the command line for the daemon, JSON-RPC over POST /api/dispatch, waiting for a state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from harness import http
from test_cli import T3D, THREAD_LINE, Ran, Served, ctl

__all__ = ["T3D", "THREAD_LINE", "Ran", "Served", "ctl", "ctl_argv", "dispatch", "new_thread", "wait_for"]


def ctl_argv(daemon: Served, *args: str) -> list[str]:
    """`t3d ctl` with the flags that find ``daemon``."""
    return [T3D, "ctl", "--state-dir", str(daemon.state_dir), "--port", str(daemon.port), *args]


async def dispatch(daemon: Served, method: str, **params: Any) -> Any:
    """One JSON-RPC call over POST /api/dispatch; its result (an error fails the test)."""
    _, reply = await http(daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})  # type: ignore[arg-type]
    assert "result" in reply, reply
    return reply["result"]


async def new_thread(daemon: Served, project: Path, *flags: str) -> str:
    """`t3d ctl new --provider replay --project DIR`: the new thread's id (from stderr)."""
    made = await ctl(daemon, "new", "--provider", "replay", "--project", str(project), *flags)
    assert made.status == 0, made.err
    [thread_id] = THREAD_LINE.findall(made.err)
    return str(thread_id)


async def wait_for(probe: Callable[[], Awaitable[Any]], seconds: float = 60) -> Any:
    """Poll ``probe`` until it returns something true (at most ``seconds``); that value."""
    with trio.fail_after(seconds):
        while True:
            value = await probe()
            if value:
                return value
            await trio.sleep(0.05)


async def turn_statuses(daemon: Served, thread_id: str) -> list[str]:
    snapshot = await dispatch(daemon, "thread.snapshot", thread_id=thread_id, turn_limit=100)
    return [t["status"] for t in snapshot["turns"]]
