"""The tools ``/mcp`` offers: threads, runtime requests, and work, over the JSON-RPC `Methods`.

Every tool calls the same methods the JSON-RPC API serves (and reads the same shell as
``GET /api/shell``), so an MCP client can do nothing another client cannot. A tool checks
its arguments with the API's `Params` (every problem named at once, unknown arguments
refused, as its ``inputSchema`` says) and answers with a text a model can read and the
same data as ``structuredContent``. Every failure, a bad argument included, is a tool
result with ``isError: true`` whose text names the problem and the fix; the protocol's own
errors (an unknown tool) are mcp.py's.

wait_for_request is the hot one: a commit that opens a request wakes every bot waiting, so
its result is encoded once per set of requests found (`McpTools.wake_reply`) and shared by
every waiter woken with the same ones; only the JSON-RPC id and framing differ per reply.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson

from t3d.api.jsonrpc import INVALID_PARAMS, Params, RpcError
from t3d.api.methods import (
    RUNTIME_MODES,
    WAIT_DEFAULT_S,
    WAIT_LIMIT_DEFAULT,
    WAIT_MAX_S,
    WAIT_THREADS_MAX,
    Methods,
    watched_threads,
)
from t3d.domain.model import DECISIONS, PROVIDERS, TERMINAL_TURN_STATUSES
from t3d.errors import T3dError
from t3d.live.waiters import Found

THREAD_STATUSES = ("idle", "running", "waiting", "queued")
LIST_DEFAULT, LIST_MAX = 100, 1000
TEXT_CHARS = 4000  # assistant text shown in a tool's text (structuredContent has it whole)

# wait_for_request results kept for the waiters woken by the same commit (a few commits'
# worth; the oldest is dropped at the bound).
WAKE_REPLIES = 32

Json = dict[str, Any]
Output = tuple[str, Json]  # (text for the model, structuredContent)


@attrs.frozen
class Built:
    """A tool's whole result, already encoded (``content`` and ``structuredContent`` as
    `orjson.Fragment`): what `McpTools.call` returns as it is."""

    result: Json


def _s(description: str, **extra: Any) -> Json:
    return {"type": "string", "description": description, **extra}


def _schema(required: tuple[str, ...] = (), **properties: Json) -> Json:
    schema: Json = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


THREAD_ID = _s("the thread's id (list_threads names them)")


@attrs.frozen
class Tool:
    name: str
    title: str
    description: str
    input_schema: Json
    run: Callable[[McpTools, Params], Awaitable[Output | Built]]

    def listing(self) -> Json:
        return {"name": self.name, "title": self.title, "description": self.description, "inputSchema": self.input_schema}


class McpTools:
    def __init__(self, methods: Methods, shell: Callable[[], Awaitable[Json]]) -> None:
        self.methods = methods
        self.shell = shell
        self._tools = {tool.name: tool for tool in TOOLS}
        # wait_for_request's result by what it carries: every waiter a commit wakes with
        # the same requests (same filter, any cursor before them) shares one encoding.
        self.wake_replies: dict[tuple[Found, ...], Json] = {}

    def listing(self) -> list[Json]:
        return [tool.listing() for tool in TOOLS]

    def has(self, name: str) -> bool:
        return name in self._tools

    async def call(self, name: str, arguments: Json) -> Json:
        tool = self._tools[name]
        try:
            output = await tool.run(self, Params(arguments, name))
        except RpcError as exc:
            hint = " (tools/list gives each tool's inputSchema)" if exc.code == INVALID_PARAMS else ""
            return _error(f"{name}: {exc.message}{hint}")
        except T3dError as exc:
            return _error(f"{name}: {exc}")
        if isinstance(output, Built):
            return output.result
        text, data = output
        return {"content": [{"type": "text", "text": text}, {"type": "text", "text": orjson.dumps(data).decode()}], "structuredContent": data, "isError": False}

    async def rpc(self, method: str, **params: Any) -> Any:
        """A JSON-RPC method's result as plain JSON values (encoded fragments decoded)."""
        return orjson.loads(orjson.dumps(await self.methods.call(method, {k: v for k, v in params.items() if v is not None})))

    def wake_reply(self, found: list[Found]) -> Json:
        """The result for a wait that found ``found`` (sorted): built once per set of requests."""
        key = tuple(found)
        result = self.wake_replies.get(key)
        if result is None:
            result = _wait_reply(found)
            if len(self.wake_replies) >= WAKE_REPLIES:
                del self.wake_replies[next(iter(self.wake_replies))]
            self.wake_replies[key] = result
        return result

    async def snapshot(self, thread_id: str, turn_limit: int) -> Json:
        return await self.rpc("thread.snapshot", thread_id=thread_id, turn_limit=turn_limit)  # type: ignore[no-any-return]


def _error(text: str) -> Json:
    return {"content": [{"type": "text", "text": text}], "isError": True}


# --- threads -------------------------------------------------------------------------------


async def list_threads(t: McpTools, p: Params) -> Output:
    status = p.choice("status", THREAD_STATUSES, default="") or None
    project_id = p.opt_str("project_id", max_len=200)
    project_path = p.opt_str("project_path", max_len=4096)
    archived = p.opt_bool("include_archived", default=False)
    limit = p.opt_int("limit", default=LIST_DEFAULT, low=1, high=LIST_MAX)
    p.check()
    shell = await t.shell()
    projects = {pr["id"]: pr for pr in shell.get("projects") or []}
    if project_path is not None:
        by_path = [pr["id"] for pr in projects.values() if pr["path"] == _normalized(project_path)]
        if not by_path:
            raise RpcError(INVALID_PARAMS, f"no project has the path {project_path!r}; list_threads without it names the projects")
        project_id = by_path[0]
    rows = [
        th for th in shell.get("threads") or []
        if (archived or not th.get("archived_at")) and (status is None or th.get("status") == status)
        and (project_id is None or th.get("project_id") == project_id)
    ]  # fmt: skip
    threads = [_thread_row(th, projects) for th in rows[:limit]]
    lines = [f"{len(rows)} thread(s)" + (f", the first {limit} shown" if len(rows) > limit else "") + ":"]
    lines += [f"- {th['id']} [{th['status']}] {th['title']!r} in {th['project_path']} ({th['turn_count']} turns)" for th in threads]
    data = {"threads": threads, "total": len(rows), "projects": [{"id": pr["id"], "path": pr["path"], "title": pr.get("title")} for pr in projects.values()]}
    return "\n".join(lines), data


def _normalized(path: str) -> str:
    """A path as projects store theirs (no trailing slash, no ``..``). Pure."""
    return os.path.normpath(path)


def _thread_row(thread: Json, projects: dict[str, Json]) -> Json:
    keys = ("id", "title", "status", "queue_reason", "project_id", "provider", "model", "runtime_mode", "worktree_path", "branch", "parent_thread_id", "created_at", "archived_at", "turn_count", "item_count")
    row = {k: thread.get(k) for k in keys}
    row["project_path"] = (projects.get(thread.get("project_id") or "") or {}).get("path")
    return row


async def get_thread(t: McpTools, p: Params) -> Output:
    thread_id = p.str("thread_id", max_len=200)
    turns = p.opt_int("turns", default=5, low=1, high=50)
    p.check()
    snap = await t.snapshot(thread_id, turns)
    thread, last = snap["thread"], _last_turn(snap)
    text = _assistant_text(snap, last["id"]) if last else ""
    data = {
        "thread": thread,
        "turns": [_turn_row(turn) for turn in snap["turns"]],
        "last_turn": _turn_row(last) if last else None,
        "last_turn_assistant_text": text,
        "pending_requests": snap.get("requests") or [],
        "has_older_turns": snap.get("has_more", False),
    }
    lines = [f"Thread {thread['id']} {thread['title']!r}: {thread['status']}" + (f" ({thread['queue_reason']})" if thread.get("queue_reason") else "") + "."]
    if last:
        lines.append(_turn_line(last))
        lines.append(f"Its assistant text:\n{_clip(text)}" if text else "Its assistant text: none yet.")
    else:
        lines.append("No turn yet; start one with start_turn.")
    lines += [f"Pending: {_request_line(r)}" for r in data["pending_requests"]]
    return "\n".join(lines), data


# --- requests ------------------------------------------------------------------------------


async def list_requests(t: McpTools, p: Params) -> Output:
    thread_id = p.opt_str("thread_id", max_len=200)
    p.check()
    requests = (await t.rpc("requests.pending", thread_id=thread_id))["requests"]
    lines = [f"{len(requests)} pending request(s)" + (":" if requests else "; wait_for_request waits for the next one.")]
    lines += [f"- {_request_line(r)}" for r in requests]
    return "\n".join(lines), {"requests": requests}


async def wait_for_request(t: McpTools, p: Params) -> Output | Built:
    thread_id = p.opt_str("thread_id", max_len=200)
    thread_ids = p.opt_str_list("thread_ids", max_items=WAIT_THREADS_MAX, max_len=200)
    after = p.opt_int("after", default=0, low=0, high=1 << 62)
    timeout = p.opt_int("timeout_s", default=WAIT_DEFAULT_S, low=0, high=WAIT_MAX_S)
    p.check()
    threads = watched_threads(thread_id, thread_ids)
    found, cursor = await t.methods.wait_found(after, threads, timeout, WAIT_LIMIT_DEFAULT)
    if not found:
        return f"No request opened within {timeout} s. Call wait_for_request again with after={cursor}.", {"requests": [], "cursor": cursor}
    result = t.wake_reply(found)
    t.methods.waiters.replied(found, "mcp")
    return Built(result)


def _wait_reply(found: list[Found]) -> Json:
    """wait_for_request's result for ``found`` (sorted, not empty), encoded: the requests'
    wire JSON is spliced in, not decoded and encoded again."""
    cursor = found[-1][0]
    listed = b"[" + b",".join(wire for _, _, wire in found) + b"]"
    structured = b'{"requests":' + listed + b',"cursor":' + str(cursor).encode() + b"}"
    requests = orjson.loads(listed)
    lines = [f"{len(requests)} pending request(s); answer each with respond_to_request, then call wait_for_request with after={cursor}:"]
    lines += [f"- {_request_line(r)}" for r in requests]
    content = orjson.dumps([{"type": "text", "text": "\n".join(lines)}, {"type": "text", "text": structured.decode()}])
    return {"content": orjson.Fragment(content), "structuredContent": orjson.Fragment(structured), "isError": False}


async def respond_to_request(t: McpTools, p: Params) -> Output:
    request_id = p.str("request_id", max_len=200)
    decision = p.choice("decision", DECISIONS)
    message = p.opt_str("message", max_len=10_000)
    p.check()
    result = await t.rpc("request.respond", request_id=request_id, decision=decision, message=message)
    return f"Request {request_id} answered: {decision}" + (f" ({message})" if message else "") + ".", result


# --- work ----------------------------------------------------------------------------------


async def start_turn(t: McpTools, p: Params) -> Output:
    thread_id = p.str("thread_id", max_len=200)
    text = p.str("text", max_len=1_000_000)
    p.check()
    result = await t.rpc("turn.start", thread_id=thread_id, text=text)
    return f"Turn {result['turn_id']} is {result['status']} on thread {thread_id}; follow it with task_status.", {"thread_id": thread_id, **result}


async def delegate_task(t: McpTools, p: Params) -> Output:
    text = p.str("text", max_len=1_000_000)
    project_id = p.opt_str("project_id", max_len=200)
    project_path = p.opt_str("project_path", max_len=4096)
    provider = p.choice("provider", PROVIDERS, default="claude")
    model = p.opt_str("model", max_len=200)
    title = p.opt_str("title", max_len=500)
    runtime_mode = p.choice("runtime_mode", RUNTIME_MODES, default="approval-required")
    worktree = p.opt_bool("worktree", default=False)
    p.check()
    if (project_id is None) == (project_path is None):
        raise RpcError(INVALID_PARAMS, "give exactly one of project_id and project_path (an absolute directory; its project is created if new)")
    if project_path is not None:
        project_id = (await t.rpc("project.create", path=project_path))["project_id"]
    created = await t.rpc(
        "thread.create", project_id=project_id, provider=provider, model=model, runtime_mode=runtime_mode,
        title=title or " ".join(text.split())[:60], workspace={"worktree": {}} if worktree else None,
    )  # fmt: skip
    thread_id = created["thread_id"]
    started = await t.rpc("turn.start", thread_id=thread_id, text=text)
    data = {"project_id": project_id, "thread_id": thread_id, "turn_id": started["turn_id"], "status": started["status"]}
    return f"Started turn {started['turn_id']} ({started['status']}) on new thread {thread_id}; follow it with task_status thread_id={thread_id}.", data


async def task_status(t: McpTools, p: Params) -> Output:
    thread_id = p.str("thread_id", max_len=200)
    turn_id = p.opt_str("turn_id", max_len=200)
    p.check()
    snap = await t.snapshot(thread_id, 1 if turn_id is None else 10)
    turn = _last_turn(snap) if turn_id is None else next((x for x in snap["turns"] if x["id"] == turn_id), None)
    if turn is None:
        missing = "has no turn yet; start one with start_turn" if turn_id is None else f"has no turn {turn_id!r} among its last 10; get_thread lists its turns"
        raise RpcError(INVALID_PARAMS, f"thread {thread_id!r} {missing}")
    text = _assistant_text(snap, turn["id"])
    pending = [r for r in snap.get("requests") or [] if r.get("turn_id") == turn["id"]]
    done = turn["status"] in TERMINAL_TURN_STATUSES
    data = {"thread_id": thread_id, "thread_status": snap["thread"]["status"], "turn": _turn_row(turn), "done": done, "assistant_text": text, "pending_requests": pending}
    lines = [_turn_line(turn)]
    lines += [f"Waiting on: {_request_line(r)}" for r in pending]
    lines.append(f"Assistant text:\n{_clip(text)}" if text else "Assistant text: none yet.")
    return "\n".join(lines), data


async def interrupt_turn(t: McpTools, p: Params) -> Output:
    thread_id = p.str("thread_id", max_len=200)
    p.check()
    result = await t.rpc("turn.interrupt", thread_id=thread_id)
    return f"Interrupt requested for thread {thread_id}'s running turn; task_status shows when it ends.", {"thread_id": thread_id, **result}


async def force_stop(t: McpTools, p: Params) -> Output:
    thread_id = p.str("thread_id", max_len=200)
    p.check()
    result = await t.rpc("thread.force_stop", thread_id=thread_id)
    return f"Thread {thread_id}'s agent was killed; its running turn ends cancelled (force_stop).", {"thread_id": thread_id, **result}


# --- reading snapshots ---------------------------------------------------------------------


def _last_turn(snap: Json) -> Json | None:
    turns = snap.get("turns") or []
    return max(turns, key=lambda turn: turn["ordinal"]) if turns else None


def _assistant_text(snap: Json, turn_id: str) -> str:
    items = sorted((i for i in snap.get("items") or [] if i.get("turn_id") == turn_id and i.get("kind") == "assistant_message"), key=lambda i: i["ordinal"])
    return "\n\n".join(i.get("text") or "" for i in items).strip()


def _turn_row(turn: Json) -> Json:
    keys = ("id", "ordinal", "status", "queue_reason", "error", "reason", "requested_at", "started_at", "completed_at", "cost_usd")
    return {k: turn.get(k) for k in keys}


def _turn_line(turn: Json) -> str:
    why = f": {turn['error']}" if turn.get("error") else (f" ({turn['queue_reason']})" if turn.get("queue_reason") else "")
    return f"Turn {turn['ordinal']} ({turn['id']}) is {turn['status']}{why}."


def _request_line(request: Json) -> str:
    data = request.get("data") or {}
    what = data.get("tool_name") or request.get("kind")
    tool_input = data.get("input")
    detail = ""
    if isinstance(tool_input, dict):
        for key in ("file_path", "path", "command", "pattern", "url", "description"):
            if isinstance(tool_input.get(key), str):
                detail = " " + _clip(tool_input[key], 120)
                break
    return f"{request['id']} on thread {request['thread_id']}: {request.get('kind')} for {what}{detail}"


def _clip(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_DECISION = _s("allow; allow_session (Codex: allow, and the same for the rest of its session; Claude Code: a plain allow, it asks again); deny (the agent is told no, and message where its protocol takes one: Claude Code does, Codex's current approvals do not); cancel (withdraw the prompt)", enum=list(DECISIONS))

TOOLS = (
    Tool(
        "list_threads", "List threads",
        "The daemon's threads (one line each: id, status, title, project) and its projects; filter by status or project.",
        _schema(
            status=_s("only threads in this status", enum=list(THREAD_STATUSES)),
            project_id=_s("only this project's threads"),
            project_path=_s("only the threads of the project at this absolute path"),
            include_archived={"type": "boolean", "description": "include archived threads (default false)"},
            limit={"type": "integer", "minimum": 1, "maximum": LIST_MAX, "description": f"at most this many (default {LIST_DEFAULT})"},
        ),
        list_threads,
    ),
    Tool(
        "get_thread", "Get a thread",
        "One thread's state: its status, its latest turns, the last turn's assistant text, and its pending requests.",
        _schema(("thread_id",), thread_id=THREAD_ID, turns={"type": "integer", "minimum": 1, "maximum": 50, "description": "how many recent turns to list (default 5)"}),
        get_thread,
    ),
    Tool(
        "list_requests", "List pending requests",
        "The runtime requests (permission prompts) agents are waiting on, oldest first; of one thread, or of all.",
        _schema(thread_id=_s("only this thread's requests")),
        list_requests,
    ),
    Tool(
        "wait_for_request", "Wait for the next request",
        "Long-poll: returns at once the pending requests opened after the cursor `after` (0: every pending one), "
        f"else as soon as one opens, else after timeout_s (default {WAIT_DEFAULT_S}, at most {WAIT_MAX_S}; keep it below your "
        "client's own request timeout) with none. Always returns the cursor to pass as `after` next time, so no request is missed.",
        _schema(
            after={"type": "integer", "minimum": 0, "description": "the cursor the previous call returned (default 0)"},
            thread_id=_s("only this thread's requests (a cursor belongs to the filter it was returned for)"),
            thread_ids={
                "type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": WAIT_THREADS_MAX,
                "description": "only these threads' requests (instead of thread_id): a bot that answers for some agents watches just theirs",
            },
            timeout_s={"type": "integer", "minimum": 0, "maximum": WAIT_MAX_S, "description": f"seconds to wait at most (default {WAIT_DEFAULT_S})"},
        ),
        wait_for_request,
    ),
    Tool(
        "respond_to_request", "Answer a request",
        "Answer a pending runtime request: allow it (on Codex optionally for the rest of its session), deny it (with a message for the agent where its protocol takes one), or cancel it.",
        _schema(("request_id", "decision"), request_id=_s("the request's id (from list_requests or wait_for_request)"), decision=_DECISION, message=_s("for deny: what the agent is told")),
        respond_to_request,
    ),
    Tool(
        "start_turn", "Start a turn",
        "Send a prompt to an existing thread; it starts at once, or queues behind the thread's running turn.",
        _schema(("thread_id", "text"), thread_id=THREAD_ID, text=_s("the prompt")),
        start_turn,
    ),
    Tool(
        "delegate_task", "Delegate a task",
        "Create a thread in a project (by id, or by absolute directory: its project is made if new) and start its first turn with the prompt; "
        "follow it with task_status.",
        _schema(
            ("text",),
            text=_s("the prompt: what the agent should do"),
            project_id=_s("the project's id (or give project_path)"),
            project_path=_s("the project's absolute directory (or give project_id)"),
            provider=_s("the agent (default claude)", enum=list(PROVIDERS)),
            model=_s("the model (default: the provider's)"),
            title=_s("the thread's title (default: the prompt's start)"),
            runtime_mode=_s("what the agent may do without asking (default approval-required)", enum=list(RUNTIME_MODES)),
            worktree={"type": "boolean", "description": "run in a new git worktree of the project (default false: in its directory)"},
        ),
        delegate_task,
    ),
    Tool(
        "task_status", "Task status",
        "A thread's latest turn (or the turn turn_id): its status, whether it is done, its assistant text, and the requests it waits on.",
        _schema(("thread_id",), thread_id=THREAD_ID, turn_id=_s("one of the thread's last 10 turns (default: the latest)")),
        task_status,
    ),
    Tool(
        "interrupt_turn", "Interrupt a turn",
        "Ask the thread's running turn to stop (the agent winds down; it ends interrupted).",
        _schema(("thread_id",), thread_id=THREAD_ID),
        interrupt_turn,
    ),
    Tool(
        "force_stop", "Force-stop an agent",
        "Kill the thread's agent process group (TERM, a grace period, KILL); its running turn ends cancelled. Other agents keep running.",
        _schema(("thread_id",), thread_id=THREAD_ID),
        force_stop,
    ),
)
