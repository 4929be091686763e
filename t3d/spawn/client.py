"""One connection from the daemon to the spawner sidecar (Trio side of `spawner/protocol.py`).

Requests carry ids; one reader task matches replies to waiting requests,
collects the descriptors that arrive beside frames (SCM_RIGHTS, close-on-exec)
and routes exit events to children. When the connection ends, every waiting
request fails with `SidecarLostError`.

Rules:
- A spawn or attach reply becomes a `SidecarChild` in the reader task itself, so
  the child's exit event always finds it (an exit that comes first, for a child
  adopted and not yet attached, is kept for the attach).
- The spawner gone, its children's output has nowhere to go: each live child of the
  connection is stopped (TERM, then KILL; found through its pidfd, so a reused pid
  is never signalled), marked `spawner_lost`, and its exit status is `EXIT_UNKNOWN`.
  A connection the daemon closes itself (`close`, when it detaches at shutdown)
  leaves its children running for the next daemon.
- Bounded: descriptors waiting for their frame are at most `MAX_PENDING_FDS`;
  more (a confused peer) ends the connection; early exits kept are at most
  `MAX_EARLY_EXITS`.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import logging
import os
import select
import signal
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from spawner.protocol import FrameDecoder, FrameError, encode_frame
from t3d.errors import SpawnerError
from t3d.spawn.child import EXIT_UNKNOWN, Replay, SignalName

log = logging.getLogger("t3d.spawn")

MAX_PENDING_FDS = 64
MAX_EARLY_EXITS = 4096
_ANCILLARY = socket.CMSG_SPACE(MAX_PENDING_FDS * array.array("i").itemsize)
# After a child's pidfd says it has exited, how long its exit event may take to arrive.
EXIT_EVENT_WAIT_S = 2.0
# A child whose spawner died: seconds between TERM and KILL.
LOST_KILL_AFTER_S = 3.0


class SidecarLostError(SpawnerError):
    """The connection to the spawner ended while a request was waiting."""


class SidecarChild:
    """A long-lived child of the spawner: our dup of its stdin, the read ends of its relay
    pipes, and a pidfd."""

    def __init__(
        self,
        conn: SidecarConnection,
        child_id: int,
        pid: int,
        fds: list[int],
        *,
        replay: Replay | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self._conn = conn
        self.child_id = child_id
        self.pid = pid
        self.stdin = trio.lowlevel.FdStream(fds[0])
        self.stdout = trio.lowlevel.FdStream(fds[1])
        self.stderr = trio.lowlevel.FdStream(fds[2])
        self._pidfd: int | None = fds[3]
        self.scope: str | None = None
        self.returncode: int | None = None
        self._exited = trio.Event()
        self.replay = replay or Replay()
        self.meta: dict[str, Any] = dict(meta or {})
        self.detachable = True
        self.spawner_lost = False

    def on_exit(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    async def watch_pidfd(self) -> None:
        """Close the pidfd once the child is gone; report an unknown exit if the spawner cannot."""
        assert self._pidfd is not None
        try:
            await trio.lowlevel.wait_readable(self._pidfd)
            with trio.move_on_after(EXIT_EVENT_WAIT_S):
                await self._exited.wait()
            if self.returncode is None:
                log.warning("pid %d exited after its spawner went away; its exit status is unknown", self.pid)
                self.on_exit(EXIT_UNKNOWN)
        finally:
            pidfd, self._pidfd = self._pidfd, None
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)

    def _alive(self) -> bool:
        if self._pidfd is None:
            return False
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)

    async def signal(self, sig: SignalName) -> None:
        if self.returncode is not None:
            return
        if not self._conn.closed.is_set():
            with contextlib.suppress(SidecarLostError):
                await self._conn.request({"op": "signal", "child": self.child_id, "signal": sig})
                return
        self._killpg(sig)

    def _killpg(self, sig: SignalName) -> None:
        if self._alive():  # the spawner is gone; the pidfd says the group id is still this child's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, getattr(signal, "SIG" + sig))

    async def ack(self, offset: int, meta: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"op": "ack", "child": self.child_id, "offset": offset}
        if meta is not None:
            self.meta = {**self.meta, **meta}
            message["meta"] = self.meta
        await self._conn.request(message)

    async def close_stdin(self) -> None:
        await self.stdin.aclose()
        if not self._conn.closed.is_set():
            with contextlib.suppress(SpawnerError):
                await self._conn.request({"op": "close_stdin", "child": self.child_id})

    def detach(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            stream.close()

    async def stop_after_spawner_loss(self) -> None:
        """The spawner died: nothing relays this child's output any more; stop it."""
        self.spawner_lost = True
        if self.returncode is not None or not self._alive():
            return
        log.warning("pid %d lost its spawner; stopping it", self.pid)
        self._killpg("TERM")
        with trio.move_on_after(LOST_KILL_AFTER_S):
            await self._exited.wait()
        if self.returncode is None:
            self._killpg("KILL")


class _Waiting:
    def __init__(self, on_reply: Callable[[dict[str, Any], list[int]], Any] | None) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None
        self.result: Any = None
        self.on_reply = on_reply


class SidecarConnection:
    def __init__(self, sock: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        self._sock = sock
        self._nursery = nursery  # outlives the connection: children's pidfd watchers run here
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._fds: deque[int] = deque()
        self._children: dict[int, SidecarChild] = {}
        self._exit_waiters: dict[int, trio.Event] = {}
        self._early_exits: dict[int, int] = {}
        self.closed = trio.Event()
        self.close_reason = ""

    @classmethod
    async def connect(cls, path: str, nursery: trio.Nursery) -> SidecarConnection:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(path)
        except OSError as exc:
            sock.close()
            raise SpawnerError(f"no spawner answers on {path}: {exc.strerror or exc}") from exc
        conn = cls(sock, nursery)
        nursery.start_soon(conn._read)
        return conn

    # -- requests -----------------------------------------------------------------------

    async def request(self, message: dict[str, Any], on_reply: Callable[[dict[str, Any], list[int]], Any] | None = None) -> Any:
        """Send one request; return its reply (or what ``on_reply`` made of it in the reader)."""
        if self.closed.is_set():
            raise SidecarLostError(f"the spawner connection is closed ({self.close_reason})")
        request_id = next(self._ids)
        waiting = self._waiting[request_id] = _Waiting(on_reply)
        try:
            frame = encode_frame({**message, "id": request_id})
            async with self._send_lock:
                await self._sock_send_all(frame)
            await waiting.done.wait()
        finally:
            self._waiting.pop(request_id, None)
        if waiting.reply is None:
            raise SidecarLostError(f"the spawner went away before answering ({self.close_reason})")
        if not waiting.reply.get("ok"):
            raise SpawnerError(str(waiting.reply.get("error") or "the spawner refused the request"))
        return waiting.result if on_reply is not None else waiting.reply

    async def spawn(self, message: dict[str, Any]) -> SidecarChild:
        def make_child(reply: dict[str, Any], fds: list[int]) -> SidecarChild:
            child = self._child(reply, fds, SidecarChild(self, reply["child"], reply["pid"], fds, meta=message.get("meta")))
            scope = reply.get("scope")
            child.scope = scope if isinstance(scope, str) else None
            return child

        child: SidecarChild = await self.request({**message, "op": "spawn"}, make_child)
        return child

    async def attach(self, child_id: int) -> SidecarChild:
        def make_child(reply: dict[str, Any], fds: list[int]) -> SidecarChild:
            replay = Replay(int(reply["start"]), int(reply["end"]), bool(reply["complete"]))
            made = SidecarChild(self, child_id, reply["pid"], fds, replay=replay, meta=reply.get("meta") or {})
            child = self._child(reply, fds, made)
            if (code := self._early_exits.pop(child_id, None)) is not None:
                child.on_exit(code)
            return child

        child: SidecarChild = await self.request({"op": "attach", "child": child_id}, make_child)
        return child

    def _child(self, reply: dict[str, Any], fds: list[int], child: SidecarChild) -> SidecarChild:
        if len(fds) != 4:
            raise FrameError(f"a {reply.get('op', 'spawn')} reply came with {len(fds)} descriptors, not 4")
        self._children[child.child_id] = child
        self._nursery.start_soon(child.watch_pidfd)
        return child

    def exit_waiter(self, child_id: int) -> trio.Event:
        """An event set when an adopted child (one we hold no pipes of) exits."""
        return self._exit_waiters.setdefault(child_id, trio.Event())

    async def _sock_send_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                sent = await self._sock.send(view)
                view = view[sent:]
        except trio.ClosedResourceError as exc:
            raise SidecarLostError(f"the spawner connection is closed ({self.close_reason})") from exc
        except OSError as exc:
            self._close(f"sending failed: {exc.strerror or exc}")
            raise SidecarLostError(f"the spawner connection broke: {exc.strerror or exc}") from exc

    # -- the reader ---------------------------------------------------------------------

    async def _read(self) -> None:
        decoder = FrameDecoder()
        reason = "the spawner closed the connection"
        try:
            while True:
                data, ancdata, flags, _ = await self._sock.recvmsg(65536, _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
                self._keep_fds(ancdata, flags)
                if not data:
                    break
                decoder.feed(data)
                while (message := decoder.next_frame()) is not None:
                    self._dispatch(message)
        except trio.ClosedResourceError:
            reason = self.close_reason or "closed"
        except (OSError, FrameError, KeyError, TypeError, ValueError) as exc:
            reason = f"the spawner sent something unexpected: {exc}"
        finally:
            self._close(reason)

    def _keep_fds(self, ancdata: list[tuple[int, int, bytes]], flags: int) -> None:
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC or len(self._fds) > MAX_PENDING_FDS:
            raise FrameError("too many descriptors arrived at once")

    def _dispatch(self, message: dict[str, Any]) -> None:
        if message.get("event") == "exit":
            child_id, returncode = message["child"], int(message["returncode"])
            if (child := self._children.pop(child_id, None)) is not None:
                child.on_exit(returncode)
            elif len(self._early_exits) < MAX_EARLY_EXITS:
                self._early_exits[child_id] = returncode
            if (waiter := self._exit_waiters.pop(child_id, None)) is not None:
                waiter.set()
            return
        fds = [self._fds.popleft() for _ in range(int(message.get("fds", 0)))]
        waiting = self._waiting.get(message.get("id"))  # type: ignore[arg-type]
        if waiting is None:
            if message.get("id") is None:
                log.warning("the spawner said: %s", message.get("error"))
            for fd in fds:
                os.close(fd)
            return
        if waiting.on_reply is not None and message.get("ok"):
            waiting.result = waiting.on_reply(message, fds)
        waiting.reply = message
        waiting.done.set()

    def _close(self, reason: str, *, lost: bool = True) -> None:
        if self.closed.is_set():
            return
        self.close_reason = reason
        self.closed.set()
        self._sock.close()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        for waiting in self._waiting.values():
            waiting.done.set()  # reply None: the request raises SidecarLostError
        for event in self._exit_waiters.values():
            event.set()
        children, self._children = self._children, {}  # their pidfd watchers report their exits
        if lost:
            for child in children.values():
                self._nursery.start_soon(child.stop_after_spawner_loss)

    def close(self) -> None:
        """Close the connection; the spawner keeps this connection's children as orphans."""
        self._close("the daemon closed the connection", lost=False)
