"""The spawner sidecar with real processes: pools, fd hand-off, exits, bad frames, restarts.

Each test talks to a real `python -m spawner` over its Unix socket, through the
daemon's own client (`open_spawner`) or a raw socket for the wire-level cases.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import trio
from harness import wait_until

from spawner.protocol import FrameDecoder, encode_frame
from t3d.config import Settings
from t3d.errors import SpawnerError
from t3d.spawn.child import Spawner
from t3d.spawn.sidecar import SidecarSpawner, open_spawner

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the spawner needs Linux pidfds")


def settings(state_dir: Path, **overrides: object) -> Settings:
    return Settings(state_dir=state_dir, **overrides)  # type: ignore[arg-type]


async def test_a_child_s_pipes_reach_the_daemon_and_its_exit_is_reported(tmp_path: Path) -> None:
    script = 'read line; echo "got $line"; echo oops >&2; ls /proc/$$/fd; exit 3'
    with trio.fail_after(20):
        async with open_spawner(settings(tmp_path)) as spawner:
            assert isinstance(spawner, SidecarSpawner)
            child = await spawner.spawn(["sh", "-c", script], cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
            # The child is the spawner's, not ours.
            assert _parent_pid(child.pid) == spawner.statistics().pid
            await child.stdin.send_all(b"hello\n")
            out = await _read_all(child.stdout)
            err = await _read_all(child.stderr)
            assert await child.wait() == 3
    lines = out.decode().splitlines()
    assert lines[0] == "got hello"
    assert err == b"oops\n"
    # Close-on-exec hygiene: the agent inherits its three pipes and nothing else.
    assert sorted(int(fd) for fd in lines[1:]) == [0, 1, 2]


async def test_run_returns_output_status_and_kills_the_group_on_timeout(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_spawner(settings(tmp_path)) as spawner:
            ok = await spawner.run(["sh", "-c", "cat; echo done >&2"], cwd=str(tmp_path), stdin=b"input")
            assert (ok.returncode, ok.stdout, ok.stderr, ok.timed_out) == (0, b"input", b"done\n", False)
            # A command run with the spawner's environment does not see what only the
            # spawner itself needed to start.
            env = await spawner.run(["env"], cwd=str(tmp_path))
            names = {line.split(b"=", 1)[0] for line in env.stdout.splitlines()}
            assert not names & {b"T3D_SPAWNER_UNSET", b"MALLOC_ARENA_MAX"}
            # A grandchild in the same group dies with the child when the timeout hits.
            marker = tmp_path / "grandchild.pid"
            slow = await spawner.run(
                ["sh", "-c", f"sleep 60 & echo $! > {marker}; wait"], cwd=str(tmp_path), kill_after=0.5
            )
            assert slow.timed_out and slow.signal == "SIGKILL"
            # The group's SIGKILL is sent before the child is reaped, but the grandchild
            # dies when the kernel next schedules it: on a loaded machine a moment later.
            # Without the group kill it would live 60 s.
            grandchild = int(marker.read_text())
            with trio.fail_after(5):
                await wait_until(lambda: not _alive(grandchild))
            capped = await spawner.run(["head", "-c", "100000", "/dev/zero"], cwd=str(tmp_path), output_cap=1000)
            assert capped.truncated and len(capped.stdout) == 1000 and capped.returncode == 0
            with pytest.raises(SpawnerError, match="could not start '/nonexistent/tool'"):
                await spawner.run(["/nonexistent/tool"], cwd=str(tmp_path))


async def test_the_git_pool_holds_under_200_concurrent_runs(tmp_path: Path) -> None:
    running = tmp_path / "running"
    running.mkdir()
    # Each command marks itself running, reports how many were running at that moment, and leaves.
    script = f'touch {running}/$$; ls {running} | wc -l; sleep 0.05; rm {running}/$$'
    seen: list[int] = []
    with trio.fail_after(60):
        async with open_spawner(settings(tmp_path, spawner_git_pool=8)) as spawner:

            async def one() -> None:
                result = await spawner.run(["sh", "-c", script], cwd=str(tmp_path), pool="git")
                assert result.returncode == 0, result.stderr
                seen.append(int(result.stdout))

            async with trio.open_nursery() as nursery:
                for _ in range(200):
                    nursery.start_soon(one)
            git = (await spawner.describe())["pools"]["git"]
    assert len(seen) == 200
    assert max(seen) <= 8, f"{max(seen)} git commands ran at once in a pool of 8"
    assert git["size"] == 8 and git["completed"] == 200
    assert git["wait_ms"]["max"] > 0  # requests queued for a slot, and the wait was measured


async def test_a_hanging_forge_command_does_not_delay_git(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_spawner(settings(tmp_path)) as spawner, trio.open_nursery() as nursery:
            # Six hung forge calls: four fill the forge pool, two wait behind them.
            for _ in range(6):
                nursery.start_soon(_hang_forge, spawner, tmp_path)
            await wait_until(lambda: _forge_queued(spawner, 2))
            result = await spawner.run(["git", "--version"], cwd=str(tmp_path), pool="git", read_only=True)
            pools = (await spawner.describe())["pools"]
            assert result.returncode == 0 and result.stdout.startswith(b"git version")
            # git finished while the forge pool was still full and queued.
            assert (pools["forge"]["busy"], pools["forge"]["queued"]) == (4, 2)
            nursery.cancel_scope.cancel()


async def _forge_queued(spawner: Spawner, count: int) -> bool:
    return bool((await spawner.describe())["pools"]["forge"]["queued"] >= count)


async def _hang_forge(spawner: Spawner, cwd: Path) -> None:
    await spawner.run(["sleep", "20"], cwd=str(cwd), pool="forge", kill_after=20)


async def test_bad_frames_get_error_replies_and_the_spawner_keeps_serving(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_spawner(settings(tmp_path)) as spawner:
            assert isinstance(spawner, SidecarSpawner)
            path = str(tmp_path / "spawner.sock")
            replies = await trio.to_thread.run_sync(_send_bad_frames, path)
            assert await spawner.run(["true"], cwd=str(tmp_path)) is not None
            assert (await spawner.describe())["connections"] == 1  # the bad connection is gone
    errors = [r.get("error", "") for r in replies]
    assert all(r["ok"] is False for r in replies), replies
    assert "not JSON" in errors[0]
    assert "not an object" in errors[1]
    assert "'id' must be an integer" in errors[2]
    assert "unknown op 'explode'" in errors[3]
    assert "'argv' must be a non-empty list" in errors[4]
    assert "'signal'='STOP' is not one of" in errors[5]
    assert "'timeout'=-1 is out of range" in errors[6]
    assert "over the" in errors[7]  # an impossible length: an error, then the connection closes


def _send_bad_frames(path: str) -> list[dict[str, object]]:
    frames = [
        b"\0\0\0\x03abc",
        encode_frame([1, 2]),  # type: ignore[arg-type]
        encode_frame({"op": "ping"}),
        encode_frame({"id": 1, "op": "explode"}),
        encode_frame({"id": 2, "op": "run", "argv": []}),
        encode_frame({"id": 3, "op": "signal", "child": 1, "signal": "STOP"}),
        encode_frame({"id": 4, "op": "run", "argv": ["true"], "timeout": -1}),
        b"\xff\xff\xff\xff",
    ]
    decoder = FrameDecoder()
    replies = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b"".join(frames))
        while data := sock.recv(65536):
            decoder.feed(data)
            while (reply := decoder.next_frame()) is not None:
                replies.append(reply)
    return replies


async def test_a_killed_spawner_is_restarted_and_its_agents_are_stopped(tmp_path: Path) -> None:
    """SIGKILL to the spawner: commands in flight fail (a read-only one is retried on the
    restarted spawner); its agents are stopped, since nothing relays their output any more
    (their exit status is unknown: it died with the spawner); new work runs on the new one."""
    with trio.fail_after(40):
        async with open_spawner(settings(tmp_path)) as spawner:
            assert isinstance(spawner, SidecarSpawner)
            first_pid = spawner.statistics().pid
            assert first_pid is not None
            agent = await spawner.spawn(["cat"], cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
            failures: list[str] = []
            retried: list[int] = []

            async def doomed() -> None:
                try:
                    await spawner.run(["sleep", "10"], cwd=str(tmp_path))
                except SpawnerError as exc:
                    failures.append(str(exc))

            async def read_only() -> None:
                result = await spawner.run(["sh", "-c", "sleep 1; echo ok"], cwd=str(tmp_path), read_only=True)
                retried.append(result.returncode)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(doomed)
                nursery.start_soon(read_only)
                await wait_until(lambda: _runs_in_flight(spawner, 2))
                os.kill(first_pid, signal.SIGKILL)
            assert failures and "the spawner died while running 'sleep'" in failures[0]
            assert retried == [0]  # the read-only command ran again on the new spawner
            stats = spawner.statistics()
            assert stats.restarts == 1 and stats.connected and stats.pid != first_pid
            # The agent started by the dead spawner lost its output relay: it is stopped.
            assert await agent.wait() == 255  # its status died with its spawner: reported as unknown
            assert agent.spawner_lost and not _alive(agent.pid)
            assert await agent.stdout.receive_some(100) == b""
            new = await spawner.run(["echo", "served"], cwd=str(tmp_path))
            assert new.stdout == b"served\n"


async def _runs_in_flight(spawner: Spawner, count: int) -> bool:
    return bool((await spawner.describe())["runs_in_flight"] >= count)


async def test_required_refuses_to_start_without_the_sidecar_and_auto_falls_back(tmp_path: Path) -> None:
    long_dir = tmp_path / ("x" * 120)
    with pytest.raises(SpawnerError, match=r"T3D_PROCESS_SPAWNER=required but .* over 107 bytes"):
        async with open_spawner(settings(long_dir, process_spawner="required")):
            pass
    async with open_spawner(settings(long_dir, process_spawner="auto")) as spawner:
        assert spawner.statistics().mode == "direct"
        result = await spawner.run([sys.executable, "-c", "print('direct')"], cwd=str(tmp_path))
        assert result.stdout == b"direct\n"


async def _read_all(stream: trio.abc.ReceiveStream) -> bytes:
    chunks = [chunk async for chunk in stream]
    return b"".join(chunks)


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running (a zombie or a reaped pid is not; reading the stat of a pid that goes away
    meanwhile raises ProcessLookupError)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def test_a_new_daemon_leaves_children_of_other_state_dirs_alone_and_unclaimed_ones_stop(
    tmp_path: Path,
) -> None:
    """A child whose daemon vanished keeps running in the spawner. A daemon adopts only the
    orphans whose meta names its state dir: one spawned without it (another state dir's, or
    no daemon's) is neither listed nor touched, and is stopped after the spawner's orphan
    grace when nobody claims it."""
    path = tmp_path / "spawner.sock"
    sidecar = await trio.lowlevel.open_process(
        [sys.executable, "-m", "spawner", "--socket", str(path), "--orphan-grace", "1"]
    )
    try:
        with trio.fail_after(20):
            await wait_until(path.exists)
            [foreign] = await trio.to_thread.run_sync(_spawn_and_vanish, str(path), 1)
            async with open_spawner(settings(tmp_path)) as spawner:
                assert spawner.statistics().pid == sidecar.pid  # the running spawner was reused
                assert await spawner.adopt() == []
                assert _alive(foreign)
            await wait_until(lambda: not _alive(foreign))  # stopped after its 1 s of grace
    finally:
        sidecar.terminate()
        await sidecar.wait()


async def test_with_a_grace_of_0_an_orphan_is_stopped_even_if_the_next_daemon_asks_first(
    tmp_path: Path,
) -> None:
    """A reattach window of 0 means agents stop with their daemon. A new daemon of the same
    state dir that asks to adopt right after the old one vanished (before the spawner's
    periodic sweep) is not handed the agent: the spawner stops it instead. Before, the agent
    was adopted and kept running (a CI failure of test_restart's kill -9 test)."""
    path = tmp_path / "spawner.sock"
    sidecar = await trio.lowlevel.open_process([sys.executable, "-m", "spawner", "--socket", str(path)])
    try:
        with trio.fail_after(20):
            await wait_until(path.exists)
            for _ in range(5):  # each round races the sweep again
                meta = {"state_dir": str(tmp_path)}
                [pid] = await trio.to_thread.run_sync(_spawn_and_vanish, str(path), 1, meta, 0)
                async with open_spawner(settings(tmp_path, agent_reattach_window=0)) as spawner:
                    assert [o.pid for o in await spawner.adopt() if o.returncode is None] == []
                    await wait_until(lambda pid=pid: not _alive(pid))
    finally:
        sidecar.terminate()
        await sidecar.wait()


def _spawn_and_vanish(path: str, count: int, meta: dict[str, str] | None = None, grace: float | None = None) -> list[int]:
    """Like a daemon killed with SIGKILL: spawn children that ignore stdin EOF, then vanish."""
    decoder = FrameDecoder()
    pids = []
    extra = {**({"meta": meta} if meta else {}), **({"orphan_grace": grace} if grace is not None else {})}
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        for n in range(count):
            sock.sendall(encode_frame({"id": n, "op": "spawn", "argv": ["sleep", "60"], "tag": f"thread T{n + 1}", **extra}))
            while (reply := decoder.next_frame()) is None:
                data, fds, _, _ = socket.recv_fds(sock, 65536, 8)
                decoder.feed(data)
                for fd in fds:
                    os.close(fd)
            pids.append(reply["pid"])
    return pids


async def test_the_daemon_uses_a_socket_activated_spawner_and_leaves_it_running(tmp_path: Path) -> None:
    """Like systemd's t3d-spawner.socket: the spawner gets its listening socket as fd 3 with
    LISTEN_PID/LISTEN_FDS; the daemon connects to it instead of starting its own, and does
    not stop it on the way out."""
    path = tmp_path / "spawner.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    # execv keeps the pid, so LISTEN_PID names the spawner, as systemd would.
    activate = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()),"
        " LISTEN_FDS='1'); os.execv(sys.executable, [sys.executable, '-m', 'spawner', '--socket', 'unused'])"
    )
    activated = await trio.lowlevel.open_process(
        [sys.executable, "-c", activate, str(listener.fileno())], pass_fds=(listener.fileno(),)
    )
    listener.close()
    try:
        with trio.fail_after(20):
            async with open_spawner(settings(tmp_path, process_spawner="required")) as spawner:
                assert spawner.statistics().pid == activated.pid
                result = await spawner.run(["echo", "activated"], cwd=str(tmp_path))
                assert result.stdout == b"activated\n"
            assert activated.returncode is None and activated.poll() is None
    finally:
        activated.terminate()
        await activated.wait()
