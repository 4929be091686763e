"""The JSON-RPC methods that do not depend on a connection.

Each method checks its params (all problems named at once, unknown ones
refused), turns them into a domain command or a read, and shapes the result.
Mutating methods (`MUTATING`) take an optional client-minted ``command_id``
(minted here when absent); a retry with the same id and the same params returns
the first result exactly, and the same id with other params is refused. The
same methods serve the WebSocket and ``POST /api/dispatch``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio

import t3d
from t3d.api.db_methods import DbMethods
from t3d.api.git_methods import GitMethods
from t3d.api.jsonrpc import (
    DOMAIN_CODES,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    NOT_FOUND,
    UNAVAILABLE,
    Params,
    RpcError,
)
from t3d.domain import commands as c
from t3d.domain.model import (
    ACTIVE_TURN_STATUSES,
    DECISIONS,
    DELIVERIES,
    MAX_SUBAGENT_DEPTH,
    RUNNABLE_PROVIDERS,
)
from t3d.errors import DomainError
from t3d.live.reads import BaseReader
from t3d.live.waiters import Found, RequestWaiters, Waiter, WaitersFull
from t3d.live.wire import summarize_payload
from t3d.store import queries as q
from t3d.store.queries import DEFAULT_TURN_LIMIT, MAX_TURN_LIMIT
from t3d.store.read_classes import ReadClass
from t3d.store.store import Store

RUNTIME_MODES = ("approval-required", "auto-accept-edits", "full-access")
MAX_PATH = 32
# requests.wait: seconds a long-poll waits by default and at most; requests per reply.
WAIT_DEFAULT_S, WAIT_MAX_S = 25, 60
WAIT_LIMIT_DEFAULT, WAIT_LIMIT_MAX = 100, 1000
WAIT_THREADS_MAX = 100  # thread_ids one long-poll may watch (more: watch every thread)

Method = Callable[[Params], Awaitable[Any]]

# Methods that change something: they take ``command_id`` (the receipt makes a retry safe).
MUTATING = frozenset(
    {
        "project.create",
        "thread.create",
        "thread.rename",
        "thread.archive",
        "thread.unarchive",
        "thread.delete",
        "thread.move",
        "turn.start",
        "turn.edit",
        "turn.move",
        "turn.cancel",
        "turn.interrupt",
        "request.respond",
        "checkpoint.revert",
    }
)


def _mint() -> str:
    return uuid.uuid4().hex


def _absolute_path(raw: str) -> str:
    """``raw`` normalized (no trailing slash, no ``..``); a relative path is refused. Pure."""
    path = os.path.normpath(raw)
    if not os.path.isabs(path):
        raise RpcError(
            DOMAIN_CODES["invalid"],
            f"path {path!r} is not absolute; pass the project's absolute directory path",
        )
    return path


def thread_not_found(thread_id: str | None) -> RpcError:
    return RpcError(NOT_FOUND, f"thread {thread_id!r} does not exist; list threads with GET /api/shell")


class Methods:
    def __init__(
        self,
        store: Store,
        *,
        force_stop: Callable[[str], Awaitable[dict[str, Any]]] | None = None,
        git: GitMethods | None = None,
        shutdown: Callable[[bool], dict[str, Any]] | None = None,
        db: DbMethods | None = None,
        agents: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self._store = store
        self._force_stop = force_stop
        self._shutdown = shutdown
        self._agents = agents
        self._git = git
        self.reader = BaseReader(store)
        # requests.wait: the pending requests by sequence, and who waits (t3d/live/waiters.py).
        self.waiters = RequestWaiters()
        store.on_commit(self.waiters.on_commit)
        self._seeding = trio.Lock()
        self.table: dict[str, Method] = {
            "server.hello": self.server_hello,
            "server.shutdown": self.server_shutdown,
            "project.create": self.project_create,
            "project.list": self.project_list,
            "thread.create": self.thread_create,
            "thread.rename": self.thread_rename,
            "thread.archive": self.thread_archive,
            "thread.unarchive": self.thread_unarchive,
            "thread.delete": self.thread_delete,
            "thread.snapshot": self.thread_snapshot,
            "turn.start": self.turn_start,
            "turn.edit": self.turn_edit,
            "turn.move": self.turn_move,
            "turn.cancel": self.turn_cancel,
            "turn.interrupt": self.turn_interrupt,
            "thread.force_stop": self.thread_force_stop,
            "request.respond": self.request_respond,
            "requests.pending": self.requests_pending,
            "requests.wait": self.requests_wait,
            "item.detail": self.item_detail,
            "server.agents": self.server_agents,
        }
        if git is not None:  # worktrees, checkpoint.diff|revert, thread.move (t3d/api/git_methods.py)
            git.commit = self._commit
            self.table.update(git.table)
        if db is not None:  # db.stats|prune|vacuum|check|backup|job|cancel (t3d/api/db_methods.py)
            self.table.update(db.table)

    @property
    def store(self) -> Store:
        return self._store

    async def call(self, method: str, params: dict[str, Any], *, owner: object | None = None) -> Any:
        """Run ``method``; ``owner`` (a WebSocket connection) is what long-polls are bounded per."""
        handler = self.table.get(method)
        if handler is None:
            raise RpcError(
                METHOD_NOT_FOUND, f"unknown method {method!r}; server.hello lists the methods"
            )
        p = Params(params, method)
        if method in MUTATING:  # checked with the method's own params: one error names all
            p.opt_str("command_id", max_len=200)
        if method == "requests.wait":
            return await self.requests_wait(p, owner=owner)
        return await handler(p)

    async def _commit(self, p: Params, command: c.Command) -> dict[str, Any]:
        """Commit ``command``; the result names what it made and the sequence it reached."""
        try:
            committed = await self._store.execute(
                command, command_id=p.raw("command_id") or _mint(), fingerprint=p.fingerprint()
            )
        except DomainError as exc:
            raise RpcError(
                DOMAIN_CODES.get(exc.code, DOMAIN_CODES["invalid"]), exc.message
            ) from None
        return committed.result

    # --- methods ---------------------------------------------------------------------------

    async def server_hello(self, p: Params) -> Any:
        p.check()
        return {
            "server": "t3d",
            "version": t3d.__version__,
            "protocol": 1,
            "methods": sorted([*self.table, "subscribe.thread", "subscribe.shell", "subscribe.server", "unsubscribe"]),
            "capabilities": ["memory_pressure", *(["workspace_status"] if self._git is not None and self._git.has_status else [])],
            "providers": list(RUNNABLE_PROVIDERS),  # only what this build runs
        }

    async def server_shutdown(self, p: Params) -> Any:
        """Stop the daemon after replying; agents keep running for the next daemon on this
        state dir unless ``stop_agents``."""
        stop_agents = p.opt_bool("stop_agents", default=False)
        p.check()
        if self._shutdown is None:
            raise RpcError(DOMAIN_CODES["conflict"], "this server cannot be shut down over the API")
        return self._shutdown(stop_agents)

    async def server_agents(self, p: Params) -> Any:
        """Every live agent: its thread, provider, turn and process group's RSS and CPU
        (t3d/observe/metrics.py `Observer.agents`), and the daemon's own."""
        p.check()
        if self._agents is None:
            raise RpcError(UNAVAILABLE, "this server does not report its agents")
        return await self._agents()

    async def project_create(self, p: Params) -> Any:
        path = p.str("path")
        title = p.opt_str("title", max_len=500)
        project_id = p.opt_str("project_id", max_len=200) or _mint()
        p.check()
        path = _absolute_path(path)
        if not await trio.Path(path).is_dir():
            raise RpcError(
                DOMAIN_CODES["invalid"],
                f"path {path!r} is not a directory on this host; create it first or pass an existing directory",
            )
        return await self._commit(p, c.CreateProject(project_id, path, title))

    async def project_list(self, p: Params) -> Any:
        p.check()
        return {"projects": await self._store.projects()}

    async def thread_create(self, p: Params) -> Any:
        project_id = p.str("project_id", max_len=200)
        provider = p.choice("provider", RUNNABLE_PROVIDERS)
        title = p.opt_str("title", max_len=500)
        model = p.opt_str("model", max_len=200)
        runtime_mode = p.choice("runtime_mode", RUNTIME_MODES, default="approval-required")
        thread_id = p.opt_str("thread_id", max_len=200) or _mint()
        workspace = p.raw("workspace")
        p.check()
        if self._git is None:
            if workspace not in (None, "root"):
                raise RpcError(DOMAIN_CODES["invalid"], 'workspace must be "root": this server has no git support')
            made = None
        else:
            made = await self._git.prepare_workspace(project_id, thread_id, workspace)
        command = c.CreateThread(
            thread_id, project_id, provider, title=title, model=model, runtime_mode=runtime_mode,
            worktree_path=made.worktree_path if made else None, branch=made.branch if made else None,
        )  # fmt: skip
        try:
            result = await self._commit(p, command)
        except RpcError:
            if self._git is not None and made is not None:
                await self._git.drop_workspace(made)
            raise
        if self._git is not None:
            result["checkpoints"] = await self._git.checkpoint_support(project_id, made)
        return result

    async def thread_rename(self, p: Params) -> Any:
        thread_id, title = p.str("thread_id", max_len=200), p.str("title", max_len=500)
        p.check()
        return await self._commit(p, c.RenameThread(thread_id, title))

    async def thread_archive(self, p: Params) -> Any:
        thread_id = p.str("thread_id", max_len=200)
        p.check()
        return await self._commit(p, c.ArchiveThread(thread_id))

    async def thread_unarchive(self, p: Params) -> Any:
        thread_id = p.str("thread_id", max_len=200)
        p.check()
        return await self._commit(p, c.UnarchiveThread(thread_id))

    async def thread_delete(self, p: Params) -> Any:
        """Delete the thread; its worktree too (``remove_worktree``, default true) when a fresh
        status shows it clean, or with ``force``. A dirty worktree refuses the delete."""
        thread_id = p.str("thread_id", max_len=200)
        remove_worktree, force = p.opt_bool("remove_worktree", default=True), p.opt_bool("force", default=False)
        p.check()
        if self._git is None:
            return await self._commit(p, c.DeleteThread(thread_id))
        commit = lambda: self._commit(p, c.DeleteThread(thread_id))  # noqa: E731
        return await self._git.delete_thread(thread_id, commit, remove_worktree=remove_worktree, force=force)

    def snapshot_params(self, p: Params) -> tuple[str, int, int | None, bool]:
        """``thread_id``, ``turn_limit``, ``before`` and ``children`` of a snapshot request, checked."""
        thread_id = p.str("thread_id", max_len=200)
        turn_limit = p.opt_int("turn_limit", default=DEFAULT_TURN_LIMIT, low=1, high=MAX_TURN_LIMIT)
        before = p.opt_int("before", default=None, low=1, high=1 << 62)
        children = p.opt_bool("children", default=False)
        p.check()
        return thread_id, turn_limit, before, children

    async def thread_snapshot(self, p: Params) -> Any:
        thread_id, turn_limit, before, children = self.snapshot_params(p)
        snapshot = await self.reader.thread_snapshot_json(thread_id, turn_limit, before, children)
        if snapshot is None:
            raise thread_not_found(thread_id)
        return snapshot

    async def turn_start(self, p: Params) -> Any:
        """A turn; on a thread with a running turn it is queued behind it, or with ``delivery``
        ``steer`` written into the running turn at once (the reply's ``delivery`` says which
        happened: a thread with no running turn gets an ordinary turn, and a ``note``)."""
        thread_id = p.str("thread_id", max_len=200)
        text = p.str("text", max_len=1_000_000)
        turn_id = p.opt_str("turn_id", max_len=200) or _mint()
        delivery = p.choice("delivery", DELIVERIES, default="queue")
        p.check()
        return await self._commit(p, c.StartTurn(thread_id, turn_id, text, delivery))

    async def turn_edit(self, p: Params) -> Any:
        """Change the prompt of a queued turn (one that has not started)."""
        turn_id = p.str("turn_id", max_len=200)
        text = p.str("text", max_len=1_000_000)
        p.check()
        return await self._commit(p, c.EditTurn(turn_id, text))

    async def turn_move(self, p: Params) -> Any:
        """Move a queued turn just before another queued turn of its thread (``before``), or
        last in the queue."""
        turn_id = p.str("turn_id", max_len=200)
        before = p.opt_str("before", max_len=200)
        p.check()
        return await self._commit(p, c.MoveTurn(turn_id, before))

    async def turn_cancel(self, p: Params) -> Any:
        """Cancel a queued turn; cancelling it again changes nothing."""
        turn_id = p.str("turn_id", max_len=200)
        p.check()
        return await self._commit(p, c.CancelTurn(turn_id))

    async def turn_interrupt(self, p: Params) -> Any:
        thread_id = p.str("thread_id", max_len=200)
        p.check()
        return await self._commit(p, c.InterruptTurn(thread_id))

    async def thread_force_stop(self, p: Params) -> Any:
        """Kill the thread's agent (its process group: TERM, a grace period, KILL); its
        running turn ends cancelled (force_stop) and is named in ``turn_id`` (None: the agent
        was idle). Every other agent keeps running; with neither an agent nor a running turn
        there is nothing to stop (conflict)."""
        thread_id = p.str("thread_id", max_len=200)
        p.check()
        if self._force_stop is None:
            raise RpcError(DOMAIN_CODES["conflict"], "this server runs no agents; nothing to force stop")
        snapshot = await self._store.snapshot(thread_id, turn_limit=1)
        if snapshot is not None and snapshot["thread"].get("subagent"):
            top = await self._agent_thread(snapshot["thread"])
            raise RpcError(
                DOMAIN_CODES["conflict"],
                f"thread {thread_id!r} is a subagent: it runs inside the agent of thread {top!r}, so it "
                f"cannot be stopped alone; force stop thread {top!r} (that ends its subagents' turns too)",
            )
        running = [t["id"] for t in (snapshot or {}).get("turns", ()) if t["status"] in ACTIVE_TURN_STATUSES]
        try:
            result = await self._force_stop(thread_id)
        except DomainError as exc:
            raise RpcError(DOMAIN_CODES.get(exc.code, DOMAIN_CODES["invalid"]), exc.message) from None
        if result.get("pid") is None and not running:  # no process and no turn: nothing was stopped
            raise RpcError(DOMAIN_CODES["conflict"], f"thread {thread_id!r} has no running agent and no running turn; nothing to stop")
        # The turn that was running when asked (it ends cancelled), or None: the agent was idle.
        return {**result, "turn_id": running[0] if running else None}

    async def _agent_thread(self, thread: dict[str, Any]) -> str:
        """The thread whose agent runs subagent ``thread``: its top parent (bounded by the
        nesting the domain allows)."""
        for _ in range(MAX_SUBAGENT_DEPTH + 1):
            parent_id = thread.get("parent_thread_id")
            if not thread.get("subagent") or parent_id is None:
                break
            parent = await self._store.thread(parent_id)
            if parent is None:
                return str(parent_id)
            thread = parent
        return str(thread["id"])

    async def request_respond(self, p: Params) -> Any:
        request_id = p.str("request_id", max_len=200)
        decision = p.choice("decision", DECISIONS)
        message = p.opt_str("message", max_len=10_000)
        p.check()
        return await self._commit(p, c.RespondToRequest(request_id, decision, message))

    async def requests_pending(self, p: Params) -> Any:
        thread_id = p.opt_str("thread_id", max_len=200)
        p.check()
        await self._seed_waiters()
        wires = self.waiters.pending_wires(thread_id)  # from memory, as a long-poll answers
        if wires is not None:
            return {"requests": orjson.Fragment(b"[" + b",".join(wires) + b"]")}
        return {"requests": await self.reader.pending_requests_json(thread_id)}

    async def requests_wait(self, p: Params, *, owner: object | None = None) -> Any:
        """Long-poll: the pending requests opened after ``after`` (a sequence; 0: any), at once
        if there are some, else as soon as one opens, else ``{"requests": [], "cursor"}``
        after ``timeout`` seconds. Pass ``cursor`` as the next ``after``."""
        after = p.opt_int("after", default=0, low=0, high=1 << 62)
        thread_id = p.opt_str("thread_id", max_len=200)
        thread_ids = p.opt_str_list("thread_ids", max_items=WAIT_THREADS_MAX, max_len=200)
        timeout = p.opt_int("timeout", default=WAIT_DEFAULT_S, low=0, high=WAIT_MAX_S)
        limit = p.opt_int("limit", default=WAIT_LIMIT_DEFAULT, low=1, high=WAIT_LIMIT_MAX)
        p.check()
        threads = watched_threads(thread_id, thread_ids)
        found, cursor = await self.wait_found(after, threads, timeout, limit, owner=owner)
        if not found:
            return {"requests": [], "cursor": cursor}
        result = _wait_result(found)
        self.waiters.replied(found, "rpc")
        return result

    async def wait_found(
        self, after: int, threads: frozenset[str] | None, timeout_s: float, limit: int, *, owner: object | None = None
    ) -> tuple[list[Found], int]:
        """`requests_wait` with checked params: what it found (sorted by opening sequence)
        and the cursor to pass next (the last one's sequence; with none, where to go on)."""
        await self._seed_waiters()
        waiter = Waiter(after, threads, limit, owner)
        try:
            self.waiters.add(waiter)
        except WaitersFull as exc:
            raise RpcError(UNAVAILABLE, str(exc)) from None
        try:
            found = await self._found_now(waiter)
            if not found:
                # From now on every matching request that opens is handed to the waiter.
                with trio.move_on_after(timeout_s):
                    while not waiter.found:
                        woken = trio.Event()
                        waiter.wake = woken.set
                        await woken.wait()
                found = list(waiter.found)
            if found:
                found.sort()
                return found, found[-1][0]
            if self.waiters.pending_after(after, threads, 1):  # never skip an indexed one
                return [], after
            return [], max(after, self.waiters.last_sequence)
        finally:
            self.waiters.remove(waiter)

    async def _found_now(self, waiter: Waiter) -> list[tuple[int, str, bytes]]:
        """The indexed requests newer than the waiter's cursor (their kept wire JSON, or read
        from the database for those older than what the index keeps); if there are none,
        what commits handed the waiter."""
        listed = self.waiters.pending_after(waiter.after, waiter.threads, waiter.limit)
        if listed:
            bodies: dict[str, bytes] = {}
            for r in listed:
                if (wire := self.waiters.wire_of(r.request_id)) is not None:
                    bodies[r.request_id] = wire
            unknown = [r.request_id for r in listed if r.request_id not in bodies]
            if unknown:  # older than the kept wires: read them
                bodies.update((request_id, wire) for _, request_id, wire in await self._pending_bodies(unknown))
                self.waiters.forget(request_id for request_id in unknown if request_id not in bodies)
            found = [(r.sequence, r.request_id, bodies[r.request_id]) for r in listed if r.request_id in bodies]
            if found:
                return found
        return list(waiter.found)

    async def _seed_waiters(self) -> None:
        """Index the requests pending in the database, once (and again while overflowed)."""
        if not self.waiters.needs_seed:
            return
        async with self._seeding:
            if not self.waiters.needs_seed:
                return
            self.waiters.begin_seed()
            try:
                rows, head = await self._store.read(
                    q.pending_request_sequences_query(self.waiters.max_pending + 1), lambda raw: raw, ReadClass.SMALL
                )
            except BaseException:
                self.waiters.abort_seed()
                raise
            self.waiters.seed(rows, head)

    async def _pending_bodies(self, request_ids: list[str]) -> list[tuple[int, str, bytes]]:
        """(0, id, wire JSON) of those of ``request_ids`` still pending."""

        def decode(rows: list[tuple[str, bytes]]) -> list[tuple[int, str, bytes]]:
            return [(0, request_id, summarize_payload(body)) for request_id, body in rows]

        return await self._store.read(q.pending_requests_by_id_query(request_ids), decode, ReadClass.SMALL)

    async def item_detail(self, p: Params) -> Any:
        """The full value of an item (or a request) or of one of its fields: what the wire
        summarizes (see ``truncated`` in an entity) is whole here."""
        item_id = p.opt_str("item_id", max_len=400)
        request_id = p.opt_str("request_id", max_len=400)
        path = p.raw("path")
        p.check()
        if (item_id is None) == (request_id is None):
            raise RpcError(INVALID_PARAMS, "give exactly one of item_id and request_id")
        if path is None:
            path = []
        if not isinstance(path, list) or len(path) > MAX_PATH or not all(
            isinstance(step, (str, int)) and not isinstance(step, bool) for step in path
        ):
            raise RpcError(
                INVALID_PARAMS,
                f"path must be a list of at most {MAX_PATH} keys and list indexes, as in an "
                'entity\'s "truncated" entries (e.g. ["data", "result"])',
            )
        table, entity_id = ("items", item_id) if item_id is not None else ("requests", request_id)
        try:
            value = await self.reader.detail(table, entity_id, path)
        except KeyError as exc:
            raise RpcError(INVALID_PARAMS, f"path {path!r} is not in {table[:-1]} {entity_id!r}: {exc.args[0]}") from None
        if value is None:
            raise RpcError(NOT_FOUND, f"{table[:-1]} {entity_id!r} does not exist")
        return {"id": entity_id, "path": path, "value": value}


def _wait_result(found: list[Found]) -> dict[str, Any]:
    """A long-poll's reply: the requests in opening order (``found`` is sorted), and the
    cursor after the last."""
    return {
        "requests": orjson.Fragment(b"[" + b",".join(wire for _, _, wire in found) + b"]"),
        "cursor": found[-1][0],
    }


def watched_threads(thread_id: str | None, thread_ids: list[str] | None) -> frozenset[str] | None:
    """A long-poll's thread filter from its checked ``thread_id`` and ``thread_ids`` params:
    the threads it watches, or None for every thread."""
    if thread_id is not None and thread_ids is not None:
        raise RpcError(INVALID_PARAMS, "give thread_id (one thread) or thread_ids (several), not both")
    if thread_ids is not None:
        return frozenset(thread_ids)
    return None if thread_id is None else frozenset((thread_id,))
