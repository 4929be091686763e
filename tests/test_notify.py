"""systemd's notify protocol, read from a real datagram socket named by NOTIFY_SOCKET:
READY=1 with STATUS=, STATUS= changes, WATCHDOG=1 only while the event loop runs, STOPPING=1.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import trio
from harness import new_thread, run_turn, wait_until
from served import base_env, kill_leftovers, open_ws, provider_pids, serve

from t3d.config import load_settings
from t3d.daemon import run_daemon
from t3d.service.notify import MAX_STATUS_CHARS, NotifyTarget, notify_target, status_message


def test_the_environment_names_the_socket_and_the_watchdog() -> None:
    """NOTIFY_SOCKET is a path or an abstract name ('@' becomes a NUL); anything else means
    no notifications. WATCHDOG_USEC gives pings at half the interval, only to the process
    WATCHDOG_PID names (when set), never more often than every 50 ms; STATUS= text is one
    bounded line."""
    assert notify_target({}, 7) is None
    assert notify_target({"NOTIFY_SOCKET": "relative/x"}, 7) is None
    assert notify_target({"NOTIFY_SOCKET": "@sd"}, 7) == NotifyTarget("\0sd", None)
    env = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "30000000"}
    assert notify_target(env, 7) == NotifyTarget("/run/n", 15.0)
    assert notify_target({**env, "WATCHDOG_PID": "7"}, 7) == NotifyTarget("/run/n", 15.0)
    assert notify_target({**env, "WATCHDOG_PID": "8"}, 7) == NotifyTarget("/run/n", None)
    assert notify_target({**env, "WATCHDOG_USEC": "soon"}, 7) == NotifyTarget("/run/n", None)
    assert notify_target({**env, "WATCHDOG_USEC": "1"}, 7) == NotifyTarget("/run/n", 0.05)
    assert status_message("a\nb  c") == "STATUS=a b c"
    assert len(status_message("x" * 10_000)) == len("STATUS=") + MAX_STATUS_CHARS


def spawner_pid(state: Path) -> int | None:
    marker = str(state / "spawner.sock").encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        return int(entry)
            except OSError:
                continue
    return None


def environ_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


async def test_serve_sends_ready_status_watchdog_and_stopping(tmp_path: Path) -> None:
    """`t3d serve` under NOTIFY_SOCKET and WATCHDOG_USEC sends READY=1 with a STATUS= naming
    its URL, sessions and running turns, then WATCHDOG=1 pings; STATUS= follows a turn that
    starts; SIGTERM brings STOPPING=1 and exit 0. The spawner and the agents do not inherit
    the notify variables."""
    state, path = tmp_path / "state", tmp_path / "notify"
    receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await receiver.bind(str(path))
    env = base_env(NOTIFY_SOCKET=str(path), WATCHDOG_USEC="400000")
    pids: list[int] = []

    async def receive() -> str:
        return (await receiver.recv(65536)).decode()

    try:
        with trio.fail_after(60):
            async with serve(state, env=env) as daemon, open_ws(daemon) as client:
                ready = await receive()
                assert ready == f"READY=1\nSTATUS=serving on http://127.0.0.1:{daemon.port}; 0 sessions, 0 turns running"
                assert [await receive() for _ in range(3)] == ["WATCHDOG=1"] * 3
                thread_id = await new_thread(client, tmp_path)
                assert (await run_turn(client, thread_id, "Please READ notes.txt")).turn["status"] == "completed"
                await client.call("turn.start", thread_id=thread_id, text="Now EDIT notes.txt")
                await client.wait_event(lambda d: d["kind"] == "request.updated")
                running = f"STATUS=serving on http://127.0.0.1:{daemon.port}; 1 session, 1 turn running"
                while (message := await receive()) != running:
                    # pings, and "1 session, 0 turns running" if a check fell between the turns
                    assert message == "WATCHDOG=1" or message.endswith("1 session, 0 turns running"), message
                pids = await provider_pids(daemon)
                spawner = spawner_pid(state)
                assert spawner is not None and pids
                for pid in (spawner, *pids):
                    assert b"NOTIFY_SOCKET=" not in environ_of(pid), pid
                    assert b"WATCHDOG_USEC=" not in environ_of(pid), pid
                daemon.process.send_signal(signal.SIGTERM)
                while (message := await receive()) != "STOPPING=1":
                    assert message == "WATCHDOG=1" or message.startswith("STATUS="), message
                await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
    finally:
        receiver.close()
        kill_leftovers(pids, state)


async def test_an_abstract_socket_gets_no_watchdog_meant_for_another_process(tmp_path: Path) -> None:
    """With NOTIFY_SOCKET an abstract name ('@...') the daemon still reports READY=1 and
    STOPPING=1 there; with WATCHDOG_PID naming another process it sends no WATCHDOG=1."""
    state = tmp_path / "state"
    name = f"t3d-test-{uuid.uuid4().hex}"
    receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await receiver.bind("\0" + name)
    env = base_env(NOTIFY_SOCKET="@" + name, WATCHDOG_USEC="100000", WATCHDOG_PID="1")
    try:
        with trio.fail_after(40):
            async with serve(state, env=env) as daemon:
                assert (await receiver.recv(65536)).startswith(b"READY=1\nSTATUS=serving on")
                await trio.sleep(1.0)  # ten watchdog intervals for a ping that must not come
                daemon.process.send_signal(signal.SIGTERM)
                messages = []
                while (message := (await receiver.recv(65536)).decode()) != "STOPPING=1":
                    messages.append(message)
                assert "WATCHDOG=1" not in messages
                await daemon.process.wait()
    finally:
        receiver.close()
        kill_leftovers([], state)


async def test_watchdog_pings_stop_while_the_event_loop_is_blocked(tmp_path: Path, nursery: trio.Nursery) -> None:
    """An in-process daemon pings every 0.1 s; while its event loop is blocked (a time.sleep
    in a task of the same Trio run) no WATCHDOG=1 arrives, and the pings resume after it.
    (A thread sending pings would keep them coming: systemd would never restart a stuck loop.)"""
    path = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(0.1)
    arrivals: list[float] = []
    done = threading.Event()

    def collect() -> None:  # a thread, so arrival times are taken while the loop is blocked
        while not done.is_set():
            try:
                if receiver.recv(65536) == b"WATCHDOG=1":
                    arrivals.append(time.monotonic())
            except TimeoutError:
                continue

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
    settings = load_settings({"state_dir": str(tmp_path / "state"), "port": 0, "replay_speed": 0}, env)
    try:
        await nursery.start(partial(run_daemon, settings, notify=NotifyTarget(str(path), 0.1)))
        with trio.fail_after(30):
            await wait_until(lambda: len(arrivals) >= 3)
        blocked_at = time.monotonic()
        time.sleep(1.5)  # noqa: ASYNC251 - blocking the loop is the point
        resumed_at = time.monotonic()
        with trio.fail_after(30):
            await wait_until(lambda: any(t > resumed_at for t in arrivals))
        # Pings sent just before the block may be read a little after it began.
        assert [t for t in arrivals if blocked_at + 0.3 < t <= resumed_at] == []
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert max(gaps) >= 1.2
    finally:
        done.set()
        collector.join()
        receiver.close()
        nursery.cancel_scope.cancel()
