"""The spawner's output relay with real processes: agents outlive the connection that
started them, their output waits for the next one (bounded), and exits end the stream.

Each test runs a real `python -m spawner` and talks to it through the daemon's own client
(`SidecarConnection`), opening and closing connections the way a daemon that restarts does.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from harness import wait_until

from t3d.spawn.client import SidecarChild, SidecarConnection

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the spawner needs Linux pidfds")

STATE = {"state_dir": "/test/state"}


@asynccontextmanager
async def running_spawner(tmp_path: Path, *args: str) -> AsyncIterator[str]:
    path = tmp_path / "spawner.sock"
    process = await trio.lowlevel.open_process([sys.executable, "-m", "spawner", "--socket", str(path), *args])
    try:
        with trio.fail_after(10):
            await wait_until(path.exists)
        yield str(path)
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def connection(path: str) -> AsyncIterator[SidecarConnection]:
    async with trio.open_nursery() as nursery:
        conn = await SidecarConnection.connect(path, nursery)
        try:
            yield conn
        finally:
            conn.close()
            nursery.cancel_scope.cancel()


async def spawn(conn: SidecarConnection, script: str, **extra: object) -> SidecarChild:
    message = {"argv": [sys.executable, "-c", script], "cwd": "/", "env": {}, "meta": dict(STATE), **extra}
    return await conn.spawn(message)


async def read_exactly(child: SidecarChild, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = await child.stdout.receive_some(65536)
        assert chunk, f"EOF after {len(data)} of {count} bytes"
        data += chunk
    return bytes(data)


async def adopt_one(conn: SidecarConnection) -> dict[str, object]:
    [orphan] = (await conn.request({"op": "adopt", "match": STATE}))["children"]
    return orphan  # type: ignore[no-any-return]


ECHO = "import sys\nfor line in sys.stdin:\n    sys.stdout.write('got ' + line); sys.stdout.flush()\n"


async def test_an_agent_outlives_its_connection_and_the_next_one_replays_from_the_last_ack(tmp_path: Path) -> None:
    """The spawner keeps the agent's stdin open and its output when the connection that
    started it goes away: the next connection adopts it by its meta, attaches, and reads
    everything after the last ack (including what the agent wrote with nobody attached),
    then talks to it live through the same stdin."""
    with trio.fail_after(30):
        async with running_spawner(tmp_path) as path:
            async with connection(path) as first:
                child = await spawn(first, ECHO, tag="thread T")
                await child.stdin.send_all(b"one\n")
                assert await read_exactly(child, 8) == b"got one\n"
                await child.ack(8, {"turn_id": "t2", "turn_offset": 8})
                await child.stdin.send_all(b"two\n")
                assert await read_exactly(child, 8) == b"got two\n"  # read, never acked
                await child.stdin.send_all(b"three\n")
                child.detach()  # as a daemon that goes away: its descriptors close
            async with connection(path) as second:
                orphan = await adopt_one(second)
                assert orphan["meta"] == {**STATE, "turn_id": "t2", "turn_offset": 8}
                assert orphan["returncode"] is None and orphan["tag"] == "thread T"
                again = await second.attach(int(orphan["child"]))  # type: ignore[call-overload]
                assert (again.replay.start, again.replay.complete) == (8, True)
                assert await read_exactly(again, 18) == b"got two\ngot three\n"
                await again.stdin.send_all(b"four\n")
                assert await read_exactly(again, 9) == b"got four\n"
                await again.close_stdin()
                assert await again.wait() == 0


async def test_a_detached_agent_is_held_at_the_bound_and_loses_nothing(tmp_path: Path) -> None:
    """With nobody attached, the spawner reads an agent only until its replay buffer is
    full; the agent then waits on its pipe. A connection that attaches later reads every
    byte in order, and the replay is complete."""
    script = "import os\nfor n in range(2000):\n    os.write(1, b'%04d' % n + b'.' * 251 + b'\\n')\n"
    total = 2000 * 256
    with trio.fail_after(30):
        async with running_spawner(tmp_path, "--replay-buffer", "8192") as path:
            async with connection(path) as first:
                (await spawn(first, script)).detach()
            async with connection(path) as second:
                await wait_until(lambda: _stats(second, "replay_bytes", 8192))
                await trio.sleep(0.5)  # (the agent would have written on by now if it could)
                assert (await second.request({"op": "stats"}))["replay_bytes"] == 8192
                orphan = await adopt_one(second)
                assert orphan["returncode"] is None  # blocked on its pipe, not done
                child = await second.attach(int(orphan["child"]))  # type: ignore[call-overload]
                data = await read_exactly(child, total)
                assert data == b"".join(b"%04d" % n + b"." * 251 + b"\n" for n in range(2000))
                assert child.replay.complete and child.replay.start == 0
                assert await child.wait() == 0


async def _stats(conn: SidecarConnection, name: str, at_least: int) -> bool:
    return bool((await conn.request({"op": "stats"}))[name] >= at_least)


async def test_output_over_the_bound_while_attached_drops_the_oldest_and_says_so(tmp_path: Path) -> None:
    """An attached daemon that reads but never acks: past the bound the spawner drops the
    oldest bytes it has already forwarded. The next attach replays from after the dropped
    part and reports the replay incomplete; an ack makes it complete again."""
    script = "import os, sys\nos.write(1, b'x' * 100000)\nsys.stdin.read()\n"
    with trio.fail_after(30):
        async with running_spawner(tmp_path, "--replay-buffer", "8192") as path:
            async with connection(path) as first:
                child = await spawn(first, script)
                assert await read_exactly(child, 100000) == b"x" * 100000
                child.detach()
            async with connection(path) as second:
                orphan = await adopt_one(second)
                assert orphan["complete"] is False and orphan["end"] == 100000
                again = await second.attach(int(orphan["child"]))  # type: ignore[call-overload]
                start = again.replay.start
                assert 100000 - 8192 - 65536 <= start <= 100000 - 8192
                assert await read_exactly(again, 100000 - start) == b"x" * (100000 - start)
                await again.ack(100000)
                assert (await second.request({"op": "stats"}))["replay_incomplete"] == 0
                await again.close_stdin()
                assert await again.wait() == 0


async def test_an_exit_while_nobody_is_attached_is_kept_for_the_next_connection(tmp_path: Path) -> None:
    """An agent that writes and exits while no daemon is attached: its output and its exit
    status wait in the spawner; the next connection reads all of it, then EOF, and hears
    the exit."""
    script = "import sys\nsys.stdin.readline()\nprint('last words', flush=True)\nsys.exit(7)\n"
    with trio.fail_after(30):
        async with running_spawner(tmp_path) as path:
            async with connection(path) as first:
                child = await spawn(first, script)
                pid = child.pid
                await child.stdin.send_all(b"go\n")
                child.detach()
            async with connection(path) as second:
                await wait_until(lambda: _exited(pid))
                orphan = await adopt_one(second)
                assert orphan["returncode"] == 7
                again = await second.attach(int(orphan["child"]))  # type: ignore[call-overload]
                assert await read_exactly(again, 11) == b"last words\n"
                assert await again.stdout.receive_some(100) == b""
                assert await again.wait() == 7
                assert (await second.request({"op": "stats"}))["children"] == 0  # forgotten once read


def _exited(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


async def test_the_exit_ends_the_stream_even_if_a_grandchild_holds_stdout(tmp_path: Path) -> None:
    """A child that exits while a detached grandchild keeps its stdout open: the daemon
    still gets EOF soon after the exit (the spawner stops reading after a short drain),
    not when the grandchild exits."""
    script = (
        "import subprocess, sys, os\n"
        "subprocess.Popen(['sleep', '60'], stdout=sys.stdout, start_new_session=True)\n"
        "print('bye', flush=True)\nos._exit(1)\n"
    )
    with trio.fail_after(20):
        async with running_spawner(tmp_path) as path, connection(path) as conn:
            child = await spawn(conn, script, env={"PATH": os.environ["PATH"]})
            assert await child.wait() == 1
            with trio.fail_after(5):
                data = b""
                while chunk := await child.stdout.receive_some(100):
                    data += chunk
            assert data == b"bye\n"


async def test_the_spawner_wide_budget_holds_detached_agents_until_there_is_room(tmp_path: Path) -> None:
    """Two detached agents with more output than the spawner-wide replay budget: reading
    stops near the budget (each agent waits on its pipe); the one attached first is read in
    full, and once its output is acked the other is read again and loses nothing."""
    script = "import os, sys\nos.write(1, b'y' * 200000)\nsys.stdin.read()\n"
    with trio.fail_after(30):
        async with running_spawner(tmp_path, "--replay-budget", "65536") as path:
            async with connection(path) as first:
                for _ in range(2):
                    (await spawn(first, script)).detach()
            async with connection(path) as second:
                await wait_until(lambda: _stats(second, "replay_bytes", 65536))
                held = (await second.request({"op": "stats"}))["replay_bytes"]
                assert held <= 65536 + 2 * 65536
                orphans = (await second.request({"op": "adopt", "match": STATE}))["children"]
                one, other = (int(o["child"]) for o in orphans)
                child = await second.attach(one)
                assert await read_exactly(child, 200000 - child.replay.start) == b"y" * (200000 - child.replay.start)
                await child.ack(200000)
                again = await second.attach(other)
                assert again.replay.start == 0 and again.replay.complete
                assert await read_exactly(again, 200000) == b"y" * 200000
                for each in (child, again):
                    await each.close_stdin()
                    assert await each.wait() == 0
