"""`t3d ctl requests|approve|deny` as a person runs them, against a `t3d serve` subprocess.

The replay agent asks real permission prompts (turn 2 of the default recording asks to
Edit, turn 3 to run Bash); each `t3d ctl` call is a real process of the installed console
script. Each test states the behaviour it pins.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson
import trio
from harness import RpcClient, http, new_thread, run_turn, wait_until
from served import base_env, open_ws, serve

from t3d.ctl.requests import format_requests_table

T3D = str(Path(sys.executable).parent / "t3d")
READ, EDIT, BASH = "Please READ notes.txt", "Now EDIT notes.txt", "Now run BASH to create a file"


async def ctl(state_dir: Path, port: int, *args: str) -> tuple[int, str, str]:
    """`t3d ctl ...` run from the project's directory (tests' tmp_path is the project)."""
    done = await trio.run_process(
        [T3D, "ctl", "--state-dir", str(state_dir), "--port", str(port), *args],
        capture_stdout=True, capture_stderr=True, check=False, env=base_env(), cwd=state_dir.parent,
    )  # fmt: skip
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def waiters(daemon: Any) -> bool:
    status, health = await http(daemon, "GET", "/api/health")  # the whole report needs the token
    return status == 200 and health["live"]["request_waiters"] == 1


async def pending_request(client: RpcClient, thread_id: str) -> dict[str, Any]:
    data = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["thread_id"] == thread_id and d["entity"]["status"] == "pending")
    return data["entity"]  # type: ignore[no-any-return]


async def turn_end(client: RpcClient, turn_id: str) -> dict[str, Any]:
    data = await client.wait_event(lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn_id and d["entity"]["status"] in ("completed", "failed", "interrupted", "cancelled"))
    return data["entity"]  # type: ignore[no-any-return]


async def test_a_person_lists_approves_waits_for_and_denies_prompts(tmp_path: Path) -> None:
    """`requests` lists the pending Edit prompt (a table, or --json; --thread by a prefix), `approve` allows it and
    the turn completes; with nothing pending `requests` says so, `requests --wait --thread`
    blocks until the Bash prompt opens and prints it, `deny --message` denies it; answering it
    again, or an unknown request, exits 1 naming the problem and `t3d ctl requests`."""
    with trio.fail_after(90):
        async with serve(tmp_path / "state") as daemon, open_ws(daemon) as client:
            state, port = daemon.state_dir, daemon.port
            thread_id = await new_thread(client, tmp_path)
            assert (await run_turn(client, thread_id, READ)).turn["status"] == "completed"
            turn_id = (await client.call("turn.start", thread_id=thread_id, text=EDIT))["turn_id"]
            request = await pending_request(client, thread_id)

            status, out, err = await ctl(state, port, "requests")
            assert status == 0, err
            assert out.split()[:4] == ["REQUEST", "THREAD", "AGE", "ASKS"] and request["id"] in out and "Edit notes.txt" in out
            # --thread takes a unique prefix of the id, as THREAD arguments do.
            status, out, _ = await ctl(state, port, "requests", "--json", "--thread", thread_id[:8])
            assert status == 0 and [r["id"] for r in orjson.loads(out)] == [request["id"]]
            status, out, err = await ctl(state, port, "approve", request["id"])
            assert (status, out) == (0, f"request {request['id']} allowed\n"), err
            assert (await turn_end(client, turn_id))["status"] == "completed"

            status, out, _ = await ctl(state, port, "requests")
            assert status == 0 and out.startswith("no pending requests")
            waited: list[tuple[int, str, str]] = []
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    waited.append(await ctl(state, port, "requests", "--wait", "--json", "--thread", thread_id))

                nursery.start_soon(wait)
                await wait_until(lambda: waiters(daemon))  # it long-polls: nothing is pending yet
                bash_turn = (await client.call("turn.start", thread_id=thread_id, text=BASH))["turn_id"]
                bash = await pending_request(client, thread_id)
            [(status, out, err)] = waited
            assert status == 0, err
            assert [(r["id"], r["data"]["tool_name"]) for r in orjson.loads(out)] == [(bash["id"], "Bash")]
            status, out, err = await ctl(state, port, "deny", bash["id"], "--message", "not here")
            assert (status, out) == (0, f"request {bash['id']} denied\n"), err
            await turn_end(client, bash_turn)
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            denied = [i for i in snapshot["items"] if i["kind"] == "approval_request" and i["turn_id"] == bash_turn]
            assert [i["status"] for i in denied] == ["denied"]

            status, _, err = await ctl(state, port, "approve", bash["id"], "--session")
            assert status == 1 and "already" in err and "`t3d ctl requests` lists" in err
            status, _, err = await ctl(state, port, "deny", "no-such-request")
            assert status == 1 and "does not exist" in err


def test_the_table_shows_each_request_with_its_age_and_what_it_asks() -> None:
    """One row per request: id, thread, age, and the tool with the telling part of its input;
    an empty list says how to wait for the next one."""
    now = time.time()
    table = format_requests_table(
        [{"id": "r1", "thread_id": "t1", "kind": "permission", "created_at": now - 75, "data": {"tool_name": "Bash", "input": {"command": "make test"}}},
         {"id": "r22", "thread_id": "t2", "kind": "user_input", "created_at": None, "data": None}],
        now=now,
    )  # fmt: skip
    assert table.splitlines() == [
        "REQUEST  THREAD  AGE     ASKS",
        "r1       t1      1m 15s  Bash make test",
        "r22      t2      ?       user_input",
    ]
    assert "--wait" in format_requests_table([], now=now)
