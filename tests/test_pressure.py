"""Memory pressure end to end (issue 9): fixture PSI files under a tmp T3D_PSI_ROOT drive
a real daemon with real replay agents; opted-in clients see the level, others never do;
sampling runs only while someone listens; severe pressure holds new turn starts."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import trio
import trio.testing
from harness import RpcClient, http, new_thread, open_client, run_turn, start_daemon, wait_until
from served import base_env, open_ws, serve

from spawner.scope import scoped_argv, scopes_work, valid_unit
from t3d.pressure.core import AgentMemory
from t3d.pressure.readers import AgentProcess, agent_sizes, agents_cgroup
from t3d.pressure.sampler import PressureSampler

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "psi"
INTERVAL = 0.05
READ = "Please READ notes.txt"
T3D = str(Path(sys.executable).parent / "t3d")


def use_psi(root: Path, fixture: str | None, *, agents: str | None = None) -> None:
    """Point the host's (and optionally the agents' cgroup's) PSI at a fixture; atomic, like
    the kernel's files (a reader never sees half a file). ``None`` removes the file."""
    for path, name in (
        (root / "proc/pressure/memory", fixture),
        (agents_cgroup(root, os.getuid()) / "memory.pressure", agents),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        if name is None:
            path.unlink(missing_ok=True)
            continue
        temporary = path.with_suffix(".new")
        temporary.write_bytes((FIXTURES / name).read_bytes())
        os.replace(temporary, path)


async def next_pressure(client: RpcClient) -> dict[str, Any]:
    while True:
        note = await client.next_notification()
        if note["kind"] == "memory_pressure":
            return note["data"]  # type: ignore[no-any-return]


async def pressure_until(client: RpcClient, level: str) -> list[dict[str, Any]]:
    """Every value received up to and including the first at ``level``."""
    values = [await next_pressure(client)]
    while values[-1]["level"] != level:
        values.append(await next_pressure(client))
    return values


async def test_opted_in_clients_follow_none_severe_none_and_others_never_see_it(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """An opted-in client gets the current level with its subscription, then only changes
    (none -> severe -> none, from rewritten fixture files); a client that subscribed without
    opting in gets no memory_pressure notification at all; a reconnecting client gets the
    current value again."""
    root = tmp_path / "psi"
    use_psi(root, "calm.txt")
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", psi_root=str(root), pressure_interval=INTERVAL
        )
        async with open_client(daemon) as opted, open_client(daemon) as other:
            reply = await opted.call("subscribe.server", memory_pressure=True)
            assert reply["memory_pressure"] is True and reply["sub"]
            assert await next_pressure(opted) == {"level": "none", "agents": []}
            assert (await other.call("subscribe.server"))["memory_pressure"] is False
            await other.call("subscribe.shell")

            use_psi(root, "incident_host.txt", agents="incident_agents.txt")  # the seed's incident
            values = await pressure_until(opted, "severe")
            assert values[-1]["level"] == "severe"
            use_psi(root, "calm.txt")
            values += await pressure_until(opted, "none")
            assert all(a != b for a, b in itertools.pairwise(values))  # only changes are sent
            _, health = await http(daemon, "GET", "/api/health")
            assert (
                health["memory_pressure"]["level"] == "none"
                and health["memory_pressure"]["sampling"]
            )

            use_psi(root, "host_severe.txt")  # host full avg10=12.0
            assert (await pressure_until(opted, "severe"))[-1]["level"] == "severe"
            async with open_client(daemon) as reconnected:
                await reconnected.call("subscribe.server", memory_pressure=True)
                assert (await next_pressure(reconnected))["level"] == "severe"

            await other.call("project.list")  # reads every frame sent to it before the reply
            assert [n for n in other.notifications if n["kind"] == "memory_pressure"] == []


async def test_a_host_without_psi_stays_none_and_says_why(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """No proc/pressure/memory under the root: the level is none and the value says why
    (this is what `t3d ctl status` shows); a malformed file is reported the same way."""
    root = tmp_path / "psi"
    root.mkdir()
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", psi_root=str(root), pressure_interval=INTERVAL
        )
        async with open_client(daemon) as client:
            await client.call("subscribe.server", memory_pressure=True)
            value = await next_pressure(client)
            assert value["level"] == "none" and "no PSI at" in value["unavailable"]
            use_psi(root, "malformed.txt")
            value = await next_pressure(client)
            assert value["level"] == "none" and "avg10" in value["unavailable"]
            use_psi(root, "calm.txt")
            assert await next_pressure(client) == {"level": "none", "agents": []}


async def test_the_heaviest_agents_name_real_replay_threads(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two replay agents stay alive after their turns; under severe pressure the value names
    both threads with their process group's PSS (no systemd here), sizes rounded, never 0."""
    root = tmp_path / "psi"
    use_psi(root, "calm.txt")
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", psi_root=str(root), pressure_interval=INTERVAL
        )
        async with open_client(daemon) as client:
            project = await client.call("project.create", path=str(tmp_path))
            threads = []
            for _ in range(2):
                thread_id = (
                    await client.call(
                        "thread.create", project_id=project["project_id"], provider="replay"
                    )
                )["thread_id"]
                await client.call("subscribe.thread", thread_id=thread_id)
                assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
                threads.append(thread_id)
            await client.call("subscribe.server", memory_pressure=True)
            assert (await next_pressure(client))["level"] == "none"
            use_psi(root, "host_severe.txt")
            value = (await pressure_until(client, "severe"))[-1]
            assert sorted(a["thread_id"] for a in value["agents"]) == sorted(threads)
            for agent in value["agents"]:
                assert agent["source"] == "pss" and agent["memory_bytes"] > 1 << 20
            sizes = [a["memory_bytes"] for a in value["agents"]]
            assert sizes == sorted(sizes, reverse=True)


async def test_sampling_runs_only_while_someone_listens(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """No listener: no readings; a turn start takes exactly one (memory admission, the
    default), and none follow while it runs. A listener starts them; when the last one
    unsubscribes (or its connection closes) they stop."""
    root = tmp_path / "psi"
    use_psi(root, "calm.txt")

    async def memory() -> dict[str, Any]:
        return (await http(daemon, "GET", "/api/health"))[1]["memory_pressure"]  # type: ignore[no-any-return]

    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", psi_root=str(root), pressure_interval=INTERVAL
        )
        await trio.sleep(10 * INTERVAL)
        assert (await memory())["samples"] == 0
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            await client.call("subscribe.thread", thread_id=thread_id)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            await trio.sleep(5 * INTERVAL)
        assert (await memory())["samples"] == 1
        async with open_client(daemon) as first, open_client(daemon) as second:
            sub = (await first.call("subscribe.server", memory_pressure=True))["sub"]
            await second.call("subscribe.server", memory_pressure=True)
            before = (await memory())["samples"]
            await wait_until(lambda: _samples_above(daemon, before))
            await first.call("unsubscribe", sub=sub)
            await trio.sleep(3 * INTERVAL)
            assert (await memory())["sampling"]  # the second still listens
        await wait_until(_not_sampling(daemon))
        stopped = (await memory())["samples"]
        await trio.sleep(10 * INTERVAL)
        assert (await memory())["samples"] == stopped


async def _samples_above(daemon: Any, count: int) -> bool:
    return bool((await http(daemon, "GET", "/api/health"))[1]["memory_pressure"]["samples"] > count)


def _not_sampling(daemon: Any) -> Any:
    async def check() -> bool:
        memory = (await http(daemon, "GET", "/api/health"))[1]["memory_pressure"]
        return not memory["sampling"] and memory["listeners"] == 0

    return check


async def test_while_severe_new_turns_wait_queued_and_start_one_at_a_time_once_it_clears(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """T3D_PRESSURE_ADMISSION=on (the default): under severe pressure two new turns are
    held as queued (memory_pressure) with no listener at all; once the fixture clears they
    are admitted, one per reading, in order, and both complete."""
    root = tmp_path / "psi"
    use_psi(root, "host_severe.txt")
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery, tmp_path / "state", psi_root=str(root), pressure_interval=0.3, pressure_admission="on"
        )
        async with open_client(daemon) as client:
            events = client.record_events()
            project = await client.call("project.create", path=str(tmp_path))
            turns = []
            for _ in range(2):
                thread_id = (
                    await client.call(
                        "thread.create", project_id=project["project_id"], provider="replay"
                    )
                )["thread_id"]
                await client.call("subscribe.thread", thread_id=thread_id)
                turn_id = (await client.call("turn.start", thread_id=thread_id, text=READ))[
                    "turn_id"
                ]
                held = await client.wait_event(
                    lambda d, t=turn_id: (
                        d["kind"] == "turn.updated"
                        and d["entity"]["id"] == t
                        and d["entity"]["status"] == "queued"
                    )
                )
                assert held["entity"]["queue_reason"] == "memory_pressure"
                turns.append(turn_id)
            _, health = await http(daemon, "GET", "/api/health")
            assert (
                health["admission"]["held_turns"] == 2
                and health["memory_pressure"]["level"] == "severe"
            )

            use_psi(root, "calm.txt")
            for turn_id in turns:
                await client.wait_event(
                    lambda d, t=turn_id: (
                        d["kind"] == "turn.updated"
                        and d["entity"]["id"] == t
                        and d["entity"]["status"] == "completed"
                    )
                )
            starts = [
                e["entity"]["id"]
                for e in events
                if e["kind"] == "turn.updated"
                and e["entity"]["status"] == "starting"
                and e["entity"]["id"] in turns
            ]
            assert starts[-2:] == turns  # admitted in the order they were held


async def test_with_pressure_admission_off_turns_start_under_severe_pressure(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    root = tmp_path / "psi"
    use_psi(root, "host_severe.txt")
    with trio.fail_after(30):
        daemon = await start_daemon(
            nursery,
            tmp_path / "state",
            psi_root=str(root),
            pressure_interval=INTERVAL,
            pressure_admission="off",
        )
        async with open_client(daemon) as client:
            project = await client.call("project.create", path=str(tmp_path))
            thread_id = (
                await client.call(
                    "thread.create", project_id=project["project_id"], provider="replay"
                )
            )["thread_id"]
            await client.call("subscribe.thread", thread_id=thread_id)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"


async def test_with_no_readable_source_for_30_s_a_severe_level_falls_back_to_none(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """The sampler itself on virtual time: severe, then the PSI file disappears; the value
    first says it cannot be read (still severe), and turns none 30 s after the last reading."""
    mock_clock.autojump_threshold = 0.05  # jump only once the worker thread's read is done
    root = tmp_path / "psi"
    use_psi(root, "host_severe.txt")
    sampler = PressureSampler(root, 5.0, lambda: [])
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(sampler.run)
            listener = await sampler.listen()
            assert (orjson_loads(await listener.receive()))["level"] == "severe"
            last_readable = trio.current_time()
            use_psi(root, None)
            value = orjson_loads(await listener.receive())
            assert value["level"] == "severe" and "no PSI" in value["unavailable"]
            while value["level"] != "none":
                value = orjson_loads(await listener.receive())
            assert 30.0 <= trio.current_time() - last_readable <= 35.0 + 0.5
            nursery.cancel_scope.cancel()


def orjson_loads(raw: bytes) -> dict[str, Any]:
    value = orjson.loads(raw)
    assert isinstance(value, dict)
    return value


async def test_ctl_status_and_memory_show_the_level_and_the_heaviest_agents(tmp_path: Path) -> None:
    """`t3d ctl status` (nobody else listening) shows the level and the heaviest agent with
    its thread; `t3d ctl memory --json` prints the current value at once; on a host without
    PSI, status says why the level is none."""
    state, root = tmp_path / "state", tmp_path / "psi"
    use_psi(root, "calm.txt")
    env = base_env(T3D_PSI_ROOT=str(root), T3D_PRESSURE_INTERVAL="0.1")
    with trio.fail_after(60):
        async with serve(state, env=env) as served, open_ws(served) as client:
            project = await client.call("project.create", path=str(tmp_path))
            thread_id = (
                await client.call(
                    "thread.create", project_id=project["project_id"], provider="replay"
                )
            )["thread_id"]
            await client.call("subscribe.thread", thread_id=thread_id)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            use_psi(root, "host_severe.txt")
            ctl = [T3D, "ctl", "--state-dir", str(state), "--port", str(served.port)]
            status = await trio.run_process(
                [*ctl, "status"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            out = status.stdout.decode()
            assert "memory    severe" in out and f"thread {thread_id} (pss)" in out, status.stderr

            process = await trio.lowlevel.open_process(
                [*ctl, "memory", "--json"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
            )
            try:
                assert process.stdout is not None
                first = b""
                while b"\n" not in first:
                    first += await process.stdout.receive_some(65536)
                value = orjson.loads(first.split(b"\n")[0])
                assert value["level"] == "severe" and value["agents"][0]["thread_id"] == thread_id
            finally:
                process.kill()
                await process.wait()

            use_psi(root, None)
            await trio.sleep(0.5)  # the next readings see no source (the level stays for 30 s)
            status = await trio.run_process(
                [*ctl, "status", "--json"],
                capture_stdout=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            assert "no PSI at" in orjson.loads(status.stdout)["memory_pressure"]["unavailable"]


def test_agents_in_a_systemd_scope_are_sized_by_its_memory_current(tmp_path: Path) -> None:
    """Where the spawner put a provider in a scope, its size is the scope's memory.current
    under the PSI root (fixture here); a scope that is not there falls back to the PSS of
    the process group (this test's own process)."""
    root = tmp_path / "psi"
    scope_dir = agents_cgroup(root, os.getuid()) / "t3d-agent-a-12345678.scope"
    scope_dir.mkdir(parents=True)
    (scope_dir / "memory.current").write_text("734003200\n")
    sizes = agent_sizes(
        root,
        os.getuid(),
        [
            AgentProcess("a", os.getpid(), "t3d-agent-a-12345678"),
            AgentProcess("b", os.getpgid(0), "t3d-agent-gone"),
        ],
    )
    assert sizes[0] == AgentMemory("a", 734003200, "scope")
    assert sizes[1].thread_id == "b" and sizes[1].source == "pss" and sizes[1].size > 0


def test_the_spawner_wraps_argv_in_a_scope_only_where_systemd_works() -> None:
    """The wrapping keeps the provider's argv intact after ``--``; unit names are checked;
    on this host (no user bus, no cgroup v2) scopes are not used."""
    argv = scoped_argv(["claude", "-p"], "t3d-agent-t1-abcdef12")
    assert argv[-3:] == ["--", "claude", "-p"]
    assert (
        "--slice=t3d-agents.slice" in argv
        and "--unit=t3d-agent-t1-abcdef12" in argv
        and "--scope" in argv
    )
    assert valid_unit("t3d-agent-t1-abcdef12") and not valid_unit("a b") and not valid_unit("")
    has_bus = os.path.exists(os.path.join(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "bus"))
    if not has_bus or not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        assert scopes_work() is False
