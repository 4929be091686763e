"""The daemon's lifecycle on real processes: one daemon per state dir, daemon.json, file
modes, signals and `t3d ctl shutdown`.

Daemons run as ``python -m t3d serve --port 0`` (tests/served.py); `t3d ctl` runs as the
installed console script.
"""

from __future__ import annotations

import os
import pty
import signal
import stat
import sys
from pathlib import Path

import orjson
import pytest
import trio
from harness import RpcFailed, new_thread, run_turn
from served import base_env, kill_leftovers, open_ws, provider_pids, serve

import t3d

T3D = str(Path(sys.executable).parent / "t3d")
READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def run_t3d(*args: str) -> tuple[int, str, str]:
    done = await trio.run_process(
        [T3D, *args], capture_stdout=True, capture_stderr=True, check=False, env=base_env()
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_second_daemon_on_the_same_state_dir_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    """A second `t3d serve` on a state dir whose daemon has a turn waiting on an approval
    exits 1 with a message naming the first daemon's pid and URL and the fixes, without a
    traceback; the first daemon's turn and pending request are untouched (it answers and
    the turn completes). After the first daemon is killed with -9, a new one starts on the
    same state dir with no clean-up by hand."""
    state = tmp_path / "state"
    pids: list[int] = []
    try:
        with trio.fail_after(90):
            async with serve(state) as first, open_ws(first) as client:
                thread_id = await new_thread(client, tmp_path)
                assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
                started = await client.call("turn.start", thread_id=thread_id, text=EDIT)
                request = (await client.wait_event(lambda d: d["kind"] == "request.updated"))["entity"]
                assert request["status"] == "pending"
                pids = await provider_pids(first)
                second = await trio.run_process(
                    [sys.executable, "-m", "t3d", "serve", "--state-dir", str(state), "--port", "0"],
                    capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
                )  # fmt: skip
                stderr = second.stderr.decode()
                assert second.returncode == 1, stderr
                for words in (
                    f"pid {first.process.pid}",
                    f"http://127.0.0.1:{first.port}",
                    f"t3d ctl shutdown --state-dir {state}",
                    "use another --state-dir",
                ):
                    assert words in stderr, stderr
                assert "Traceback" not in stderr
                pending = (await client.call("requests.pending", thread_id=thread_id))["requests"]
                assert [r["id"] for r in pending] == [request["id"]]
                await client.call("request.respond", request_id=request["id"], decision="allow")
                done = await client.wait_event(
                    lambda d: d["kind"] == "turn.updated"
                    and d["entity"]["id"] == started["turn_id"]
                    and d["entity"]["status"] in ("completed", "failed", "interrupted", "cancelled")
                )
                assert done["entity"]["status"] == "completed"
                first.process.kill()
                await first.process.wait()
            async with serve(state) as third:
                assert "another t3d daemon" not in third.stderr_text()
    finally:
        kill_leftovers(pids, state)


async def test_daemon_json_and_the_state_files_are_private_and_daemon_json_goes_on_a_clean_exit(tmp_path: Path) -> None:
    """Once serving, <state>/daemon.json names the daemon's pid, URL, port, version and
    token path; it, the lock, the token, the database and its -wal and -shm are mode 0600 and
    the state dir 0700. SIGTERM stops the daemon with status 0 (logging that agents are left
    running) and removes daemon.json."""
    state = tmp_path / "state"
    try:
        with trio.fail_after(40):
            async with serve(state) as daemon:
                run = orjson.loads((state / "daemon.json").read_bytes())
                assert run["pid"] == daemon.process.pid
                assert run["url"] == f"http://127.0.0.1:{daemon.port}" and run["port"] == daemon.port
                assert run["version"] == t3d.__version__
                assert run["token"] == str(state / "auth" / "token")
                assert mode(state) == 0o700
                for name in ("daemon.json", "daemon.lock", "auth/token", "t3d.sqlite", "t3d.sqlite-wal", "t3d.sqlite-shm"):
                    assert mode(state / name) == 0o600, name
                daemon.process.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "received SIGTERM; shutting down, agents keep running" in daemon.stderr_text()
                assert not (state / "daemon.json").exists()
    finally:
        kill_leftovers([], state)


async def test_an_open_state_dir_is_warned_about_and_an_open_database_tightened(tmp_path: Path) -> None:
    """A state dir that others may enter (0755) is left as it is, with a warning that names
    it and `chmod 700`; a database file others may read (0644) is made 0600, with a warning."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    (state / "t3d.sqlite").touch()
    (state / "t3d.sqlite").chmod(0o644)
    try:
        with trio.fail_after(30):
            async with serve(state) as daemon:
                text = daemon.stderr_text()
                assert f"the state directory {state} is open to other users (mode 0755)" in text
                assert f"chmod 700 {state}" in text
                assert "made it 0600" in text
                assert mode(state) == 0o755
                assert mode(state / "t3d.sqlite") == 0o600
    finally:
        kill_leftovers([], state)


async def test_ctl_finds_a_port_0_daemon_by_daemon_json_and_names_a_stale_one(tmp_path: Path) -> None:
    """`t3d ctl status` with only --state-dir reaches a daemon started on --port 0 (through
    daemon.json). After a kill -9 the file is left behind: ctl exits 2 saying it is stale, whose
    pid is gone and how to start a daemon. A daemon.json naming a live process while no daemon
    holds the lock is stale too."""
    state = tmp_path / "state"
    try:
        with trio.fail_after(40):
            async with serve(state) as daemon:
                status, out, err = await run_t3d("ctl", "--state-dir", str(state), "status")
                assert status == 0, err
                assert f"http://127.0.0.1:{daemon.port}" in out
                daemon.process.kill()
                await daemon.process.wait()
            status, out, err = await run_t3d("ctl", "--state-dir", str(state), "status")
            assert status == 2, (out, err)
            for words in ("daemon.json is stale", f"pid {daemon.process.pid}", "is gone", "t3d serve"):
                assert words in err, err
            run = orjson.loads((state / "daemon.json").read_bytes())
            (state / "daemon.json").write_bytes(orjson.dumps({**run, "pid": os.getpid()}))
            status, out, err = await run_t3d("ctl", "--state-dir", str(state), "threads")
            assert status == 2, (out, err)
            assert "no daemon holds" in err and "stale" in err, err
    finally:
        kill_leftovers([], state)


async def test_ctl_shutdown_gets_a_reply_then_the_daemon_stops(tmp_path: Path) -> None:
    """server.shutdown refuses unknown params and is listed by server.hello. `t3d ctl shutdown`
    gets the reply, says agents keep running, waits, and the daemon exits 0 and removes
    daemon.json; `--stop-agents --json` reports stop_agents and the daemon logs that it stops
    every agent."""
    state = tmp_path / "state"
    try:
        with trio.fail_after(60):
            async with serve(state) as daemon:
                async with open_ws(daemon) as client:
                    assert "server.shutdown" in (await client.call("server.hello"))["methods"]
                    with pytest.raises(RpcFailed) as refused:
                        await client.call("server.shutdown", stop_agents=True, now=1)
                    assert "now" in str(refused.value.message)
                status, out, err = await run_t3d("ctl", "--state-dir", str(state), "shutdown")
                assert status == 0, err
                assert f"(pid {daemon.process.pid})" in out and "agents keep running" in out
                assert out.rstrip().endswith("stopped")
                with trio.fail_after(5):
                    await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "shutting down as asked over the API (agents keep running" in daemon.stderr_text()
                assert not (state / "daemon.json").exists()
            async with serve(state) as daemon:
                status, out, err = await run_t3d("ctl", "--state-dir", str(state), "shutdown", "--stop-agents", "--json")
                assert status == 0, err
                reply = orjson.loads(out)
                assert reply["stop_agents"] is True and reply["stopped"] is True
                assert reply["pid"] == daemon.process.pid
                await daemon.process.wait()
                assert daemon.process.returncode == 0
                assert "shutting down as asked over the API (stopping every agent)" in daemon.stderr_text()
    finally:
        kill_leftovers([], state)


async def test_sigint_from_a_terminal_stops_everything_and_without_one_counts_as_sigterm(tmp_path: Path) -> None:
    """SIGINT to a daemon whose stdin is a terminal (Ctrl-C) logs that every agent is stopped;
    with stdin not a terminal it logs that agents keep running, as for SIGTERM. Both exit 0."""
    state = tmp_path / "state"
    master, slave = pty.openpty()
    try:
        with trio.fail_after(40):
            async with serve(state, stdin=slave) as daemon:
                daemon.process.send_signal(signal.SIGINT)
                await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "received SIGINT (Ctrl-C); shutting down and stopping every agent" in daemon.stderr_text()
            async with serve(state) as daemon:
                daemon.process.send_signal(signal.SIGINT)
                await daemon.process.wait()
                assert daemon.process.returncode == 0, daemon.stderr_text()
                assert "received SIGINT; shutting down, agents keep running" in daemon.stderr_text()
    finally:
        os.close(master)
        os.close(slave)
        kill_leftovers([], state)
