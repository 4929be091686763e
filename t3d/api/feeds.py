"""One WebSocket connection's subscriptions: bases, live frames, resyncs.

Rules:
- Subscribe: join the hub first, then read the base (a snapshot, or a replay
  since ``after_sequence``), reply, send the base, and only then go live at
  the base's sequence. Nothing falls between base and live; frames the base
  already holds are skipped, so nothing is sent twice.
- Live frames go to the socket straight from the hub's publish when nothing
  else is being written on the connection (``direct``: no task switch); what
  the socket does not take, and every frame that finds the connection busy, is
  the sender task's. Its passes take up to `SEND_BATCH` frames from each
  bounded buffer (so a busy one cannot starve the rest) and write them all with
  one send (``send_many``). The hub never waits; a buffer that overflows
  meanwhile is dropped.
- An overflowed subscription gets ``resync``, a fresh snapshot, then live
  frames again. Its resync task starts the moment the hub marks it (not when
  the sender gets round to it), so every subscription that overflows in a
  burst joins the same wave and shares one read; and the connection's other
  subscriptions keep flowing meanwhile. The stream never ends because the
  client was slow.
- The connection's memory is bounded by its `Budget` (budget.py, 16 MiB):
  every subscription's buffer counts, and so does whatever a task holds
  until it is sent (a base, a snapshot reply, a reply, the live frame on its
  way). At the bound the fullest subscriptions are resynced first.
- One base or snapshot reply at a time: a subscribe, a resync or a
  ``thread.snapshot`` waits for the connection's previous one to be sent
  before it reads, so a client that does not read holds at most one.
- Workspace statuses (t3d/live/hub.py) go out as ``workspace.updated``
  notifications once the subscription is live, the latest value per workspace;
  on a shell subscription only when no event frame is left to send before them
  (a shell row waiting there carries an older value).
- ``thread.snapshot`` is answered in chunks too (`reply_snapshot`): one
  ``snapshot.chunk`` notification per chunk, tied to the request by its id,
  then the response with the totals (README, "Snapshots over JSON-RPC").
- `close` (the connection is gone) leaves the hub and drops every buffer
  before the connection's tasks are gone, so no publish can reach a closed
  connection; the tasks end with its nursery, and with them every chunk and
  frame they held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol

import orjson
import trio
import trio_websocket

from t3d.api import jsonrpc as rpc
from t3d.live.base import Base, Snapshot
from t3d.live.budget import CONNECTION_BYTES, Budget
from t3d.live.chunks import CHUNK_BYTES
from t3d.live.hub import Hub, Subscription
from t3d.live.reads import BaseReader
from t3d.waits import holding

MAX_SUBSCRIPTIONS = 256
# Frames a subscription may send before the sender turns to the next one.
SEND_BATCH = 64
# A streamed reply repeats its request's id in every chunk's envelope.
MAX_ID_BYTES = 1024

Send = Callable[[bytes], Awaitable[None]]
SendMany = Callable[[list[bytes]], Awaitable[None]]


class DirectWriter(Protocol):
    """Writes from synchronous code (the connection's `MessageWriter`)."""

    @property
    def ready_now(self) -> bool: ...

    def send_now(self, payloads: Sequence[bytes]) -> int: ...

    async def flush(self) -> None: ...


def _nothing() -> None:
    pass


class Feeds:
    def __init__(
        self,
        hub: Hub,
        reader: BaseReader,
        send: Send,
        *,
        budget: int = CONNECTION_BYTES,
        send_many: SendMany | None = None,
        direct: DirectWriter | None = None,
    ) -> None:
        self._hub = hub
        self._reader = reader
        self._send = send
        # Several messages in one write (the connection's `MessageWriter`); by default one by one.
        self._send_many = send_many if send_many is not None else self._send_each
        # Writes from synchronous code when the socket is free (`_deliver_now`), if given.
        self._direct = direct
        self._backlog_held = 0  # bytes of a direct write still to send, held in the budget
        self.budget = Budget(budget)
        # Held while a base or a snapshot reply is read and sent: one at a time.
        self._one_base = trio.Lock()
        self.subs: dict[str, Subscription] = {}
        self._next_sub = 0
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._closed = False

    def _woken(self, sub: Subscription) -> None:
        """The hub pushed to ``sub`` (synchronously, inside publish: never blocks)."""
        if self._closed:
            return
        if sub.needs_resync and sub.live and self._nursery is not None:
            sub.live = False  # the resync task owns it until it is live again
            self._nursery.start_soon(self._resync, sub)
        elif not self._deliver_now(sub):
            self._wake.set()

    def _deliver_now(self, sub: Subscription) -> bool:
        """Write ``sub``'s ready frames to the socket right here, when nothing else is being
        written on the connection (no task switch, no second buffer); False to leave them
        to the sender task."""
        direct = self._direct
        if direct is None or not sub.live or sub.needs_resync or not sub.frames or not direct.ready_now:
            return False
        frames = []
        for _ in range(SEND_BATCH):
            frame = sub.pop()
            if frame is None:
                break
            frames.append(rpc.notification_frame(sub.sub_id, "event", frame[0], frame[1]))
        if not frames:
            return not sub.workspace
        try:
            left = direct.send_now(frames)
        except trio_websocket.ConnectionClosed:
            return False  # the peer is gone: the sender task finds out and ends
        if left:  # the socket took part: the sender task sends the rest, counted meanwhile
            self._backlog_held += left
            self.budget.hold(left)
            return False
        # More than one batch, or workspace values (they go after the frames): the sender's.
        return not sub.frames and not sub.workspace

    # --- subscribe / unsubscribe ---------------------------------------------------------

    async def subscribe(
        self,
        request_id: rpc.RequestId,
        topic: Literal["thread", "shell"],
        thread_id: str | None,
        turn_limit: int,
        after: int | None,
        *,
        workspace: bool | None = None,
    ) -> None:
        """Answer a subscribe request: reply ``{sub, sequence, base}`` (and ``workspace`` when
        asked: whether workspace.updated notifications follow), send the base, go live.
        Raises RpcError (nothing subscribed) for a thread that does not exist."""
        if self._closed:
            raise rpc.RpcError(rpc.UNAVAILABLE, "the connection is closing")
        if len(self.subs) >= MAX_SUBSCRIPTIONS:
            raise rpc.RpcError(rpc.INVALID_REQUEST, f"a connection may hold at most {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe first")
        self._next_sub += 1
        watching = bool(workspace) and self._hub.workspaces is not None
        sub = Subscription(
            f"s{self._next_sub}", topic, thread_id, lambda: None, turn_limit=turn_limit, budget=self.budget, watch_workspace=watching
        )
        sub.wake = lambda: self._woken(sub)
        # Join first, then read: nothing falls in between. A shell resume's replay carries only
        # the rows that moved, so it is handed every workspace's current status as well.
        self._hub.subscribe(sub, every_workspace=topic == "shell" and after is not None)
        self.subs[sub.sub_id] = sub
        self.budget.members.add(sub)
        async with holding(self._one_base):
            try:
                if thread_id is None:
                    base: Base | None = await self._reader.shell_base(after)
                else:
                    base = await self._reader.thread_base(thread_id, turn_limit, after)
                if base is None:
                    raise rpc.RpcError(rpc.NOT_FOUND, f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
            except BaseException:
                self._forget(sub)
                raise
            kind = "snapshot" if isinstance(base, Snapshot) else "replay"
            reply: dict[str, object] = {"sub": sub.sub_id, "sequence": base.sequence, "base": kind}
            if workspace is not None:
                reply["workspace"] = watching
            await self._send(rpc.result_frame(request_id, reply))
            await self._send_base(sub, base)

    async def reply_snapshot(self, request_id: rpc.RequestId, thread_id: str, turn_limit: int, before: int | None, children: bool = False) -> None:
        """Answer ``thread.snapshot``: a ``snapshot.chunk`` notification per chunk (each frame
        at most 256 KiB), then the response ``{sequence, chunks}``. Raises RpcError (nothing
        sent) for a thread that does not exist."""
        if len(orjson.dumps(request_id)) > MAX_ID_BYTES:
            raise rpc.RpcError(rpc.INVALID_REQUEST, f"the request id is too long for a streamed reply; use an id of at most {MAX_ID_BYTES} bytes")
        room = CHUNK_BYTES - len(rpc.reply_chunk_frame(request_id, 1 << 62, b""))
        async with holding(self._one_base):
            snapshot = await self._reader.thread_snapshot(thread_id, turn_limit, before, room, children)
            if snapshot is None:
                raise rpc.RpcError(rpc.NOT_FOUND, f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
            size = sum(len(chunk) for chunk in snapshot.chunks)
            self.budget.hold(size)
            try:
                for chunk in snapshot.chunks:
                    await self._send(rpc.reply_chunk_frame(request_id, snapshot.sequence, chunk))
                totals = orjson.Fragment(b'{"sequence":%d,"chunks":%d}' % (snapshot.sequence, len(snapshot.chunks)))
                await self._send(rpc.result_frame(request_id, totals))
            finally:
                self.budget.release(size)

    async def send_reply(self, frame: bytes) -> None:
        """Send a reply, its bytes counted in the budget while it waits for the socket."""
        self.budget.hold(len(frame))
        try:
            await self._send(frame)
        finally:
            self.budget.release(len(frame))

    def unsubscribe(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is None:
            raise rpc.RpcError(rpc.NOT_FOUND, f"no subscription {sub_id!r} on this connection")
        self._forget(sub)

    def _forget(self, sub: Subscription) -> None:
        self._hub.unsubscribe(sub)
        self.budget.members.discard(sub)
        if self.subs.get(sub.sub_id) is sub:
            del self.subs[sub.sub_id]
        # Free its buffer now, and break the cycle sub -> wake -> sub: otherwise the
        # frames a slow client left behind (up to its budget) wait for a full collection
        # of the garbage collector, minutes apart in a serving process (gc_tuning.py).
        sub.take()
        sub.workspace.clear()
        sub.wake = _nothing

    def close(self) -> None:
        """Leave the hub and drop every buffer (idempotent)."""
        self._closed = True
        for sub in list(self.subs.values()):
            self._forget(sub)

    # --- bases -----------------------------------------------------------------------------

    async def _send_base(self, sub: Subscription, base: Base) -> None:
        """Send ``base`` (stopping early if the subscription ends), then go live at its
        sequence; its bytes count in the budget meanwhile. Called holding `_one_base`."""
        if isinstance(base, Snapshot):
            size = sum(len(chunk) for chunk in base.chunks)
        else:
            size = sum(len(frame) for _, frame in base.frames)
        self.budget.hold(size)
        try:
            await self._send_base_frames(sub, base)
        finally:
            self.budget.release(size)

    async def _send_base_frames(self, sub: Subscription, base: Base) -> None:
        seq = base.sequence
        if isinstance(base, Snapshot):
            for chunk in base.chunks:
                if sub.sub_id not in self.subs:
                    return
                await self._send(rpc.notification_frame(sub.sub_id, "snapshot.chunk", seq, chunk))
            end = b'{"sequence":%d,"chunks":%d}' % (seq, len(base.chunks))
            await self._send(rpc.notification_frame(sub.sub_id, "snapshot.end", seq, end))
        else:
            for frame_seq, frame in base.frames:
                if sub.sub_id not in self.subs:
                    return
                await self._send(rpc.notification_frame(sub.sub_id, "event", frame_seq, frame))
            synced = b'{"sequence":%d,"replayed":%d}' % (seq, len(base.frames))
            await self._send(rpc.notification_frame(sub.sub_id, "synced", seq, synced))
        sub.went_live(seq)

    async def _resync(self, sub: Subscription) -> None:
        sub.begin_resync()
        async with holding(self._one_base):
            # Joined after begin_resync, so the wave's read starts after it too; subscriptions
            # of other connections that overflowed in the same burst join the same wave.
            wave = self._reader.join_snapshot((sub.thread_id, sub.turn_limit))
            await self._send(rpc.notification_frame(sub.sub_id, "resync", sub.base_seq, b'{"reason":"overflow"}'))
            snapshot = await wave.result()
            if sub.sub_id not in self.subs:
                return
            if snapshot is None:  # the thread is gone: say so, and the subscription ends
                self._forget(sub)
                gone = orjson.dumps({"kind": "thread.deleted", "sequence": None, "entity": {"id": sub.thread_id}})
                await self._send(rpc.notification_frame(sub.sub_id, "event", sub.base_seq, gone))
                return
            await self._send_base(sub, snapshot)

    # --- live frames -----------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver live frames until cancelled (with the connection); resyncs run in here too."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    while True:
                        self._wake = trio.Event()  # fresh before the pass: a push during it is not lost
                        if not await self._deliver_pass(nursery):
                            await self._wake.wait()
                finally:
                    self.close()  # while the nursery is open: no wake can reach it closed
        finally:
            self._nursery = None

    async def _send_each(self, frames: list[bytes]) -> None:
        for frame in frames:
            await self._send(frame)

    async def _deliver_pass(self, nursery: trio.Nursery) -> bool:
        """Write what every live subscription has ready (up to `SEND_BATCH` frames each),
        in one send, after what a direct write left; False if there was nothing."""
        if self._backlog_held and self._direct is not None:
            held, self._backlog_held = self._backlog_held, 0
            try:
                await self._direct.flush()
            finally:
                self.budget.release(held)
        frames: list[bytes] = []
        size = 0
        workspaced: list[Subscription] = []  # subscriptions with workspace values to send
        for sub in list(self.subs.values()):
            if not sub.live:
                continue
            if sub.needs_resync:
                sub.live = False  # the resync task owns it until it is live again
                nursery.start_soon(self._resync, sub)
                continue
            for _ in range(SEND_BATCH):
                frame = sub.pop()
                if frame is None:
                    break
                size += len(frame[1])
                frames.append(rpc.notification_frame(sub.sub_id, "event", frame[0], frame[1]))
            if sub.workspace and (sub.topic == "thread" or not sub.frames):
                workspaced.append(sub)  # after its frames, which the values must not pass
        sent = False
        if frames:
            self.budget.hold(size)  # out of the buffers, not yet taken by the socket
            try:
                await self._send_many(frames)
            finally:
                self.budget.release(size)
            sent = True
        for sub in workspaced:
            sent = await self._send_workspaces(sub) or sent
        return sent

    async def _send_workspaces(self, sub: Subscription) -> bool:
        """Send up to `SEND_BATCH` of the subscription's waiting workspace values."""
        sent = False
        for _ in range(SEND_BATCH):
            if not sub.workspace or not sub.live or sub.needs_resync or sub.sub_id not in self.subs:
                break
            path = next(iter(sub.workspace))
            value = sub.workspace.pop(path)
            self.budget.hold(len(value))
            try:
                await self._send(rpc.notification_frame(sub.sub_id, "workspace.updated", sub.delivered_seq, value))
            finally:
                self.budget.release(len(value))
            sent = True
        return sent
