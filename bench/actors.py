"""The load's clients: agent sessions, UI subscribers, approval pollers, a snapshot poller.

Each actor is a Trio task over its own connection, using only the public API, and keeps
only what the figures need: one record per turn, counters, and per-call latencies (all
bounded by the run's length). Times are ``time.monotonic()`` (the same clock in every
process of the machine), so the coordinator can place them in the window.

Expected failures (a JSON-RPC error, an HTTP error status, a dropped connection) are
counted in `Errors` and end the actor's current step, never the run; a session whose
connection is gone stops turning, and the run is then invalid because that session
produced no output in the window. With ``reconnect`` (a run that restarts the daemon) a
session and a subscriber connect again instead, every `RECONNECT_PAUSE_S`, subscribe
again (the snapshot tells whether the turn in flight ended meanwhile) and carry on; a
``turn.start`` cut off by the restart is retried with the same ``command_id``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

import attrs
import trio
import trio_websocket

from bench.client import (
    HttpClient,
    HttpError,
    Json,
    McpClient,
    McpFailed,
    RpcClosed,
    RpcConnection,
    RpcFailed,
    open_rpc,
)

TERMINAL = frozenset({"completed", "interrupted", "failed", "cancelled"})
EXPECTED = (
    RpcFailed,
    RpcClosed,
    HttpError,
    trio_websocket.ConnectionClosed,
    trio_websocket.HandshakeError,
    trio.BrokenResourceError,
    OSError,
)
MAX_ERROR_TEXTS = 20
RECONNECT_PAUSE_S = 0.2


@attrs.define
class Errors:
    """Counts by kind and the first few messages; bounded."""

    counts: Counter[str] = attrs.field(factory=Counter)
    first: list[str] = attrs.field(factory=list)

    def add(self, where: str, exc: BaseException) -> None:
        self.counts[f"{where}: {type(exc).__name__}"] += 1
        if len(self.first) < MAX_ERROR_TEXTS:
            self.first.append(f"{where}: {exc!r}"[:300])


@attrs.frozen
class Window:
    t0: float
    start: float
    end: float

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end


async def sleep_until(at: float) -> None:
    await trio.sleep(max(0.0, at - time.monotonic()))


def trio_deadline(at: float) -> float:
    """``at`` (``time.monotonic()`` seconds) on Trio's clock, which has its own origin."""
    return trio.current_time() + (at - time.monotonic())


# --- agent sessions ------------------------------------------------------------------


@attrs.define
class TurnRecord:
    session: int
    turn_id: str
    start: float
    dispatch_ms: float | None = None
    first_item: float | None = None
    reply_done: float | None = None
    end: float | None = None
    status: str | None = None
    prompted: bool = False


class Session:
    """One agent session: one thread, subscribed on the session's own connection."""

    def __init__(
        self, index: int, window: Window, errors: Errors, *, answer_prompts: bool, reconnect: bool = False,
        provider: str = "replay",
    ) -> None:
        self.index = index
        self.provider = provider
        self.window = window
        self.errors = errors
        self.answer_prompts = answer_prompts
        self.reconnect = reconnect
        self.reconnects = 0
        self._rpc: RpcConnection | None = None
        self._connected = trio.Event()
        self.thread_id = ""
        self.turns: list[TurnRecord] = []
        self.outputs_in_window = 0
        self.resyncs = 0
        self.broken = False
        self._current: TurnRecord | None = None
        self._done = trio.Event()
        self._to_answer: trio.MemorySendChannel[str] | None = None

    def on_note(self, note: Json, at: float) -> None:
        kind = note.get("kind")
        if kind == "resync":
            self.resyncs += 1
        elif kind == "snapshot.chunk" and isinstance(note.get("data"), dict):
            self._on_snapshot(note["data"], at)  # a chunk holds a part of each list
        elif kind == "event":
            self._on_event(note["data"], at)

    def _on_event(self, data: Json, at: float) -> None:
        turn = self._current
        entity = data.get("entity") or {}
        kind = data.get("kind")
        if turn is None:
            return
        if kind == "item.updated" and entity.get("turn_id") == turn.turn_id:
            if entity.get("kind") == "user_message":
                return
            if turn.first_item is None:
                turn.first_item = at
            if self.window.holds(at):
                self.outputs_in_window += 1
            if (
                turn.reply_done is None
                and entity.get("kind") == "assistant_message"
                and entity.get("status") == "completed"
            ):
                turn.reply_done = at
        elif (
            kind == "request.updated"
            and entity.get("turn_id") == turn.turn_id
            and entity.get("status") == "pending"
        ):
            turn.prompted = True
            if self.answer_prompts and self._to_answer is not None:
                try:
                    self._to_answer.send_nowait(entity["id"])
                except trio.WouldBlock:
                    self.errors.add("session", RuntimeError("more than 16 prompts unanswered"))
        elif (
            kind == "turn.updated"
            and entity.get("id") == turn.turn_id
            and entity.get("status") in TERMINAL
        ):
            self._finish(turn, entity["status"], at)

    def _on_snapshot(self, snapshot: Json, at: float) -> None:
        """After a resync: the turn may have ended while our buffer was dropped."""
        turn = self._current
        for t in snapshot.get("turns") or []:
            if turn is not None and t.get("id") == turn.turn_id and t.get("status") in TERMINAL:
                self._finish(turn, t["status"], at)

    def _finish(self, turn: TurnRecord, status: str, at: float) -> None:
        if turn.end is None:
            turn.end, turn.status = at, status
            self._done.set()

    def _closed(self, exc: BaseException) -> None:
        if self.reconnect:
            self._connected = trio.Event()  # until `open` has connected again
            return
        self.errors.add("session connection", exc)
        self.broken = True
        self._done.set()

    async def open(
        self, port: int, token: str, project_id: str, *, task_status: trio.TaskStatus[RpcConnection]
    ) -> None:
        """Connect, create the thread and subscribe; then serve the connection until cancelled
        (with ``reconnect``: connect and subscribe again whenever it ends)."""
        try:
            async with open_rpc(port, token, self.on_note, self._closed) as rpc:
                created = await rpc.call(
                    "thread.create",
                    project_id=project_id,
                    provider=self.provider,
                    title=f"bench {self.index}",
                )
                self.thread_id = created["thread_id"]
                await rpc.call("subscribe.thread", thread_id=self.thread_id)
                self._rpc = rpc
                self._connected.set()
                task_status.started(rpc)
                if not self.reconnect:
                    await trio.sleep_forever()
                await rpc.gone.wait()
        except EXPECTED:
            if self._rpc is None or not self.reconnect:
                raise  # set-up failed, or a run that does not reconnect
        while True:
            await trio.sleep(RECONNECT_PAUSE_S)
            try:
                async with open_rpc(port, token, self.on_note, self._closed) as rpc:
                    await rpc.call("subscribe.thread", thread_id=self.thread_id)
                    self._rpc = rpc
                    self.reconnects += 1
                    self._connected.set()
                    await rpc.gone.wait()
            except EXPECTED:
                pass  # the daemon is not serving again yet

    async def _live(self, rpc: RpcConnection) -> RpcConnection:
        """The connection to use: ``rpc``, or with ``reconnect`` the current one once connected."""
        if not self.reconnect:
            return rpc
        await self._connected.wait()
        assert self._rpc is not None
        return self._rpc

    async def run(self, rpc: RpcConnection, first_at: float, think_s: float) -> None:
        send, receive = trio.open_memory_channel[str](16)
        self._to_answer = send
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer, rpc, receive)
            await sleep_until(first_at)
            while time.monotonic() < self.window.end:
                if not await self.turn(rpc):
                    break
                await trio.sleep(think_s)
            nursery.cancel_scope.cancel()

    async def turn(self, rpc: RpcConnection) -> bool:
        """One turn: start it, wait for its terminal event. False when the connection failed."""
        record = TurnRecord(self.index, uuid.uuid4().hex, time.monotonic())
        self._current, self._done = record, trio.Event()
        self.turns.append(record)
        # With reconnect, a call the restart cut off is sent again: the same command_id
        # makes the retry return the first call's result, never a second turn.
        retry = {"command_id": record.turn_id} if self.reconnect else {}
        while True:
            try:
                live = await self._live(rpc)
                await live.call(
                    "turn.start", thread_id=self.thread_id, text="go", turn_id=record.turn_id, **retry
                )
                break
            except RpcFailed as exc:
                self.errors.add("turn.start", exc)
                record.status = "rejected"
                return True
            except EXPECTED as exc:
                self.errors.add("session", exc)
                if not self.reconnect:
                    return False
                await trio.sleep(RECONNECT_PAUSE_S)
        record.dispatch_ms = (time.monotonic() - record.start) * 1000
        await self._done.wait()
        return not self.broken

    async def _answer(self, rpc: RpcConnection, receive: trio.MemoryReceiveChannel[str]) -> None:
        async for request_id in receive:
            try:
                await (await self._live(rpc)).call("request.respond", request_id=request_id, decision="allow")
            except EXPECTED as exc:
                self.errors.add("request.respond", exc)


# --- UI subscribers --------------------------------------------------------------------


@attrs.define
class SubscriberStats:
    events: int = 0
    resyncs: int = 0
    switches: int = 0
    subscribe_ms: list[float] = attrs.field(factory=list)
    # From sending subscribe.thread to the first snapshot.chunk of the new subscription.
    first_chunk_ms: list[float] = attrs.field(factory=list)
    # When the subscribe in progress was sent (None: its first chunk has come).
    pending_since: float | None = None


async def run_subscriber(
    port: int, token: str, threads: list[str], first: int, switch_s: float, phase_s: float,
    window: Window, stats: SubscriberStats, errors: Errors, reconnect: bool = False,
) -> None:  # fmt: skip
    """Follow one thread; every ``switch_s`` (first after ``phase_s``) move to the next one.
    With ``reconnect`` a lost connection is opened again (on the thread it followed)."""
    position = [first]
    again = False
    while True:
        await _follow(port, token, threads, position, switch_s, phase_s, window, stats, errors, again)
        if not reconnect:
            return
        again = True
        await trio.sleep(RECONNECT_PAUSE_S)


async def _follow(
    port: int, token: str, threads: list[str], position: list[int], switch_s: float, phase_s: float,
    window: Window, stats: SubscriberStats, errors: Errors, again: bool,
) -> None:  # fmt: skip

    def on_note(note: Json, at: float) -> None:
        if note.get("kind") == "event":
            stats.events += 1
        elif note.get("kind") == "resync":
            stats.resyncs += 1
        elif note.get("kind") == "snapshot.chunk":
            first_chunk(stats, at, window)

    try:
        async with open_rpc(port, token, on_note) as rpc:
            sub = await _subscribe(rpc, threads[position[0] % len(threads)], stats, window)
            next_switch = window.t0 + phase_s
            while again and switch_s > 0 and next_switch < time.monotonic():
                next_switch += switch_s  # connected again: the next switch in the schedule
            while switch_s > 0:
                await sleep_until(next_switch)
                next_switch += switch_s
                await rpc.call("unsubscribe", sub=sub)
                position[0] += 1
                sub = await _subscribe(rpc, threads[position[0] % len(threads)], stats, window)
                stats.switches += 1
            await rpc.gone.wait()
    except EXPECTED as exc:
        errors.add("subscriber", exc)


def first_chunk(stats: SubscriberStats, at: float, window: Window) -> None:
    """A snapshot.chunk came: the first one after a subscribe ends its wait."""
    if stats.pending_since is not None:
        if window.holds(stats.pending_since):
            stats.first_chunk_ms.append((at - stats.pending_since) * 1000)
        stats.pending_since = None


async def _subscribe(
    rpc: RpcConnection, thread_id: str, stats: SubscriberStats, window: Window
) -> str:
    started = time.monotonic()
    stats.pending_since = started  # one subscribe at a time on this connection
    # A UI shows the thread's workspace status too: its subscription watches it.
    result = await rpc.call("subscribe.thread", thread_id=thread_id, workspace=True)
    if window.holds(started):
        stats.subscribe_ms.append((time.monotonic() - started) * 1000)
    return str(result["sub"])


# --- approval pollers -----------------------------------------------------------------

@attrs.define
class PollerStats:
    polls: int = 0
    approvals: int = 0
    calls: int = 0  # requests the poller sent the daemon in the window
    pending_ms: list[float] = attrs.field(factory=list)
    shell_ms: list[float] = attrs.field(factory=list)
    # Per request opened in the window and answered by a poller: from its opening to the
    # poller having it in hand, and to the poller's answer committed (respond returned).
    seen_ms: list[float] = attrs.field(factory=list)
    answered_ms: list[float] = attrs.field(factory=list)

    def approval(self, request: Json, seen: float, answered: float, window: Window) -> None:
        created = request.get("created_at")
        if not isinstance(created, int | float):
            return
        # created_at is the daemon's wall clock as it decided to open the request, just
        # before its commit; put on this process's monotonic clock with the offset read
        # now, not once at start, so a step of the wall clock (NTP) before the request
        # does not skew it (one run gave p50 -3.9 s that way).
        opened = created - (time.time() - time.monotonic())
        if window.holds(opened):
            self.seen_ms.append((seen - opened) * 1000)
            self.answered_ms.append((answered - opened) * 1000)


async def run_poller(
    port: int, token: str, mine: frozenset[str], interval_s: float, phase_s: float,
    window: Window, stats: PollerStats, errors: Errors,
) -> None:  # fmt: skip
    """An approval bot: list pending requests and the shell; allow the prompts of its threads."""
    client = HttpClient(port, token)
    try:
        await sleep_until(window.t0 + phase_s)
        while True:
            started = time.monotonic()
            try:
                await _poll_once(client, mine, window, stats, started)
            except EXPECTED as exc:
                errors.add("poller", exc)
            await sleep_until(started + interval_s)
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def _poll_once(
    client: HttpClient, mine: frozenset[str], window: Window, stats: PollerStats, started: float
) -> None:
    pending = await client.request("GET", "/api/requests/pending")
    listed = time.monotonic()
    calls = 2
    for request in pending.get("requests") or []:
        if request.get("thread_id") in mine and request.get("status") == "pending":
            calls += 1
            try:
                await client.request(
                    "POST", f"/api/requests/{request['id']}/respond", {"decision": "allow"}
                )
                stats.approvals += 1
                stats.approval(request, listed, time.monotonic(), window)
            except HttpError as exc:
                if exc.status != 409:  # already answered (a retry after a dropped reply)
                    raise
    shell_started = time.monotonic()
    # Every byte is received, none parsed: the bot does not use the shell, and parsing a
    # 2,700-thread shell (1.5 MB) 31 times a second took most of the driver's CPU at PRIMARY
    # 250, so its own lag, not the daemon, set the client-side figures on large databases.
    await client.request("GET", "/api/shell", decode=False)
    if window.holds(started):
        stats.polls += 1
        stats.calls += calls
        stats.pending_ms.append((listed - started) * 1000)
        stats.shell_ms.append((time.monotonic() - shell_started) * 1000)


MCP_WAIT_S = 25


async def run_mcp_poller(
    port: int, token: str, mine: frozenset[str], phase_s: float, window: Window,
    stats: PollerStats, errors: Errors,
) -> None:  # fmt: skip
    """An approval bot over MCP, as the seed's: long-poll wait_for_request for its own threads
    (thread_ids: so a request wakes only the bot that answers it), allow their prompts with
    respond_to_request, pass the cursor back. It never polls the shell."""
    client = McpClient(port, token)
    cursor = 0
    watched = sorted(mine)
    try:
        await sleep_until(window.t0 + phase_s)
        await client.request("server/discover", {})
        while True:
            started = time.monotonic()
            try:
                waited = await client.call_tool("wait_for_request", after=cursor, thread_ids=watched, timeout_s=MCP_WAIT_S)
                seen = time.monotonic()
                cursor = waited["cursor"]
                calls = 1
                for request in waited["requests"]:
                    if request.get("thread_id") in mine:
                        calls += 1
                        try:
                            await client.call_tool("respond_to_request", request_id=request["id"], decision="allow")
                            stats.approvals += 1
                            stats.approval(request, seen, time.monotonic(), window)
                        except McpFailed as exc:
                            if "already" not in str(exc):
                                raise
                if window.holds(started):
                    stats.polls += 1
                    stats.calls += calls
            except (*EXPECTED, McpFailed) as exc:
                errors.add("mcp poller", exc)
                await trio.sleep(1)  # do not spin on a daemon that refuses
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


# --- the largest thread's snapshot ----------------------------------------------------


@attrs.define
class SnapshotStats:
    polls: int = 0
    snapshot_ms: list[float] = attrs.field(factory=list)
    largest_items: int = 0


LARGEST_REFRESH_S = 30.0


async def run_snapshot_poller(
    port: int, token: str, interval_s: float, window: Window, stats: SnapshotStats, errors: Errors
) -> None:
    """Every ``interval_s``, the full snapshot (every turn) of the thread with the most items."""
    client = HttpClient(port, token)
    largest: str | None = None
    refreshed = float("-inf")
    try:
        while True:
            started = time.monotonic()
            try:
                if started - refreshed > LARGEST_REFRESH_S:
                    shell = await client.request("GET", "/api/shell")
                    threads: list[Any] = shell.get("threads") or []
                    if threads:
                        top = max(threads, key=lambda t: t.get("item_count") or 0)
                        largest, stats.largest_items = top["id"], top.get("item_count") or 0
                    refreshed = started
                if largest is not None:
                    began = time.monotonic()
                    await client.request("GET", f"/api/threads/{largest}?turn_limit=1000")
                    if window.holds(began):
                        stats.polls += 1
                        stats.snapshot_ms.append((time.monotonic() - began) * 1000)
            except EXPECTED as exc:
                errors.add("snapshot", exc)
            await sleep_until(started + interval_s)
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


# --- the driver's own loop ------------------------------------------------------------


async def run_lag_monitor(window: Window, samples: list[float]) -> None:
    """How late the driver's own loop wakes (a driver bottleneck shows here first)."""
    while True:
        before = time.monotonic()
        await trio.sleep(0.05)
        after = time.monotonic()
        if window.holds(after):
            samples.append(max(0.0, after - before - 0.05) * 1000)
