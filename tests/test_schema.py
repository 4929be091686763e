"""The API's JSON Schema (t3d/api/schema.py) against the live daemon.

The schema is a declarative table, so these tests hold it to the code: every method the
daemon serves has an entry (a method added without one fails here), the params each method
takes are its entry's properties, real results and notifications validate against it, and
it is served at GET /api/schema and written by `t3d schema`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import trio
from git_support import make_repo
from harness import RpcClient, RpcFailed, http, open_client, run_turn, start_daemon

from t3d.api import schema

INVALID_PARAMS = -32602
UNKNOWN = "zz_not_a_param"
TAKES = re.compile(r"^unknown param '" + UNKNOWN + r"'; (\S+) takes (.*)$")
DEFINITIONS = schema.definitions()


def validate(name: str, value: Any) -> None:
    """``value`` is valid against definition ``name`` of the whole document."""
    jsonschema.Draft7Validator({"$ref": f"#/definitions/{name}", "definitions": DEFINITIONS}).validate(value)


def taken(problems: list[str], method: str) -> set[str]:
    """The params a method says it takes, from its unknown-param problem (Params.check)."""
    for problem in problems:
        if match := TAKES.match(problem):
            assert match.group(1) == method
            return set() if match.group(2) == "no params" else set(match.group(2).split(", "))
    raise AssertionError(f"{method}: no unknown-param problem in {problems}")


def record_notifications(client: RpcClient) -> list[dict[str, Any]]:
    """From now on, every notification the client reads is also kept in the list returned."""
    seen: list[dict[str, Any]] = []
    read = client.next_notification

    async def reading() -> dict[str, Any]:
        note = await read()
        seen.append(note)
        return note

    client.next_notification = reading  # type: ignore[method-assign]
    return seen


def test_the_document_and_every_file_are_valid_draft_07() -> None:
    """The whole document and each file `files()` makes are valid JSON Schema, each file
    self-contained (every $ref it has resolves inside it)."""
    jsonschema.Draft7Validator.check_schema(schema.document())
    for name, body in schema.files().items():
        jsonschema.Draft7Validator.check_schema(body)
        refs = re.findall(r'"\$ref":"#/definitions/([^"]+)"', orjson.dumps(body).decode())
        assert set(refs) <= set(body.get("definitions", {})), name


async def test_every_served_method_has_an_entry_whose_params_are_what_it_takes(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """For every method in server.hello's list (the live method table), the schema has params
    and result definitions, and a call with an unknown param is refused listing exactly the
    params the schema's entry has (command_id included for mutating methods)."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            methods = (await client.call("server.hello"))["methods"]
            missing = [m for m in methods if m not in schema.METHODS]
            assert not missing, f"methods without an entry in t3d/api/schema.py METHODS: {missing}"
            assert sorted(schema.METHODS) == sorted(methods), "schema entries for methods the daemon does not serve"
            for method in methods:
                name = schema.type_name(method)
                assert {f"{name}Params", f"{name}Result"} <= set(DEFINITIONS), method
                with pytest.raises(RpcFailed) as refused:
                    await client.call(method, **{UNKNOWN: 1})
                assert refused.value.code == INVALID_PARAMS, method
                properties = set(DEFINITIONS[f"{name}Params"]["properties"])
                assert taken(refused.value.data["problems"], method) == properties, method
        daemon.stop()


async def test_real_results_and_notifications_validate(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Results of real calls on a git project (create, turn, snapshot both ways, checkpoint
    diff and revert, workspace status, move, force stop, delete...) validate against their result schemas,
    their params against the params schemas, and every notification received against
    ServerNotification."""
    repo = make_repo(tmp_path / "repo")
    plain = tmp_path / "plain"
    plain.mkdir()
    with trio.fail_after(90):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            calls: list[tuple[str, dict[str, Any], Any]] = []
            notifications = record_notifications(client)

            async def call(method: str, **params: Any) -> Any:
                result = await client.call(method, **params)
                calls.append((method, params, result))
                return result

            await call("server.hello")
            project = (await call("project.create", path=str(repo), title="repo"))["project_id"]
            await call("project.create", path=str(repo))  # existed
            plain_project = (await call("project.create", path=str(plain)))["project_id"]
            await call("project.list")
            await call("thread.create", project_id=plain_project, provider="replay")  # no checkpoints
            thread = (await call("thread.create", project_id=project, provider="replay", runtime_mode="full-access"))["thread_id"]
            await call("subscribe.thread", thread_id=thread)
            await call("subscribe.shell", workspace=True)
            server = (await call("subscribe.server", memory_pressure=True))["sub"]
            outcome = await run_turn(client, thread, "Please READ notes.txt")
            assert outcome.turn["status"] == "completed"
            await client.wait_event(lambda d: d["kind"] == "checkpoint.updated" and d["entity"]["ordinal"] == 1)
            await call("thread.rename", thread_id=thread, title="renamed")
            await call("thread.snapshot", thread_id=thread, turn_limit=5)  # streamed: {sequence, chunks}
            item = outcome.items[-1]["id"]
            await call("item.detail", item_id=item, path=["text"])
            await call("requests.pending", thread_id=thread)
            await call("requests.wait", thread_id=thread, timeout=0)
            agents = await call("server.agents")  # its idle agent, sized from /proc
            assert [(a["thread_id"], a["status"]) for a in agents["agents"]] == [(thread, "idle")]
            await call("workspace.status", thread_id=thread, refresh=True)
            await call("checkpoint.diff", thread_id=thread, from_ordinal=0, to_ordinal=1)
            await call("checkpoint.revert", thread_id=thread, ordinal=0)
            await call("thread.force_stop", thread_id=thread)  # its idle agent
            await call("turn.start", thread_id=thread, text="Now EDIT notes.txt")  # waits on its prompt
            queued = await call("turn.start", thread_id=thread, text="Say ok")
            later = await call("turn.start", thread_id=thread, text="Say ok again")
            await call("turn.edit", turn_id=queued["turn_id"], text="Say ok, edited")
            await call("turn.move", turn_id=later["turn_id"], before=queued["turn_id"])
            await call("turn.cancel", turn_id=later["turn_id"])
            await call("turn.cancel", turn_id=queued["turn_id"])
            await call("turn.interrupt", thread_id=thread)
            await client.wait_event(lambda d: d["kind"] == "turn.updated" and d["entity"]["status"] == "interrupted")
            await call("unsubscribe", sub=server)
            await call("thread.move", thread_id=thread, workspace={"worktree": {}})
            await call("thread.archive", thread_id=thread)
            await call("thread.unarchive", thread_id=thread)
            await call("db.stats")
            for method, params in (
                ("db.prune", {"dry_run": True}), ("db.prune", {}), ("db.vacuum", {}), ("db.check", {}),
                ("db.backup", {"path": str(tmp_path / "backup.sqlite")}),
            ):  # fmt: skip
                job = await call(method, **params)
                while job["state"] == "running":
                    job = await call("db.job", job_id=job["job_id"])
                assert job["state"] == "done", job
            await call("db.cancel", job_id=job["job_id"])
            await call("thread.delete", thread_id=thread, force=True)
            _, over_http = await http(
                daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": "thread.snapshot", "params": {"thread_id": "none"}}
            )
            await call("server.shutdown")  # last: the daemon stops just after replying
            notifications.extend(client.notifications)  # received, not yet read
        daemon.stop()
    for method, params, result in calls:
        name = schema.type_name(method)
        validate(f"{name}Params", params)
        validate(f"{name}Result", result)
    assert {method for method, _, _ in calls} >= set(schema.METHODS) - {"request.respond"}
    validate("JSONRPCError", over_http)
    assert {n["kind"] for n in notifications} >= {"snapshot.chunk", "snapshot.end", "event", "memory_pressure", "workspace.updated"}
    for note in notifications:
        validate("ServerNotification", {"jsonrpc": "2.0", "method": "sub", "params": note})


async def test_a_snapshot_over_http_and_a_prompt_answer_validate(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.snapshot over POST /api/dispatch (the whole snapshot) validates as ThreadSnapshot,
    and request.respond's result as its schema, with events of a pending request on the way."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            project = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            thread = (await client.call("thread.create", project_id=project, provider="replay"))["thread_id"]
            await client.call("subscribe.thread", thread_id=thread)
            await run_turn(client, thread, "Please READ notes.txt")
            turn = (await client.call("turn.start", thread_id=thread, text="Now EDIT notes.txt"))["turn_id"]
            pending = await client.wait_event(lambda d: d["kind"] == "request.updated" and d["entity"]["status"] == "pending")
            answered = await client.call("request.respond", request_id=pending["entity"]["id"], decision="deny", message="no")
            await client.wait_event(lambda d: d["kind"] == "turn.updated" and d["entity"]["id"] == turn and d["entity"]["status"] == "completed")
        _, reply = await http(
            daemon, "POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": "thread.snapshot", "params": {"thread_id": thread}}
        )
        daemon.stop()
    validate("ThreadSnapshotResult", reply["result"])
    validate("ThreadSnapshot", reply["result"])
    validate("RequestRespondResult", answered)
    validate("RequestRespondParams", {"request_id": pending["entity"]["id"], "decision": "deny", "message": "no"})


async def test_the_schema_is_served_with_the_token_and_written_by_t3d_schema(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """GET /api/schema answers the document (401 without the token, 400 with a query param it
    does not take); `t3d schema` prints the same document and `t3d schema --out DIR` writes it
    with one file per type."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        status, served = await http(daemon, "GET", "/api/schema")
        assert status == 200 and served == schema.document()
        assert (await http(daemon, "GET", "/api/schema", token=False))[0] == 401
        assert (await http(daemon, "GET", "/api/schema?x=1"))[0] == 400
        daemon.stop()
        printed = await trio.run_process([sys.executable, "-m", "t3d", "schema"], capture_stdout=True, stdin=subprocess.DEVNULL)
        assert orjson.loads(printed.stdout) == schema.document()
        out = tmp_path / "schema"
        await trio.run_process([sys.executable, "-m", "t3d", "schema", "--out", str(out)], capture_stderr=True, stdin=subprocess.DEVNULL)
    written = {path.name: orjson.loads(path.read_bytes()) for path in out.iterdir()}
    assert written == schema.files()
    assert {"t3d_api.schemas.json", "ThreadCreateParams.json", "ThreadCreateResult.json", "ClientRequest.json", "ServerNotification.json"} <= set(written)
    params = written["ThreadCreateParams.json"]
    jsonschema.validate({"project_id": "p", "provider": "replay"}, params)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"project_id": "p", "provider": "replay", "titel": "x"}, params)


def test_a_method_without_an_entry_would_be_caught() -> None:
    """The table names each method once with a params and a result schema; type names are
    unique (two methods cannot share a file)."""
    names = [schema.type_name(m) for m in schema.METHODS]
    assert len(names) == len(set(names))
    assert schema.type_name("thread.force_stop") == "ThreadForceStop"
