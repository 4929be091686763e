"""The spawner sidecar: starts every process so the daemon never forks.

Threads: the main thread runs one selector loop over the listening socket, the
long-lived children (their pidfds, and their output relays: `spawner.agents`) and a
wake pipe (signals, requests that changed what to watch); each connection has a reader
thread; each `run` request has a worker thread that waits for a slot in its pool.

Rules:
- Bad frames get an error reply naming the problem; only a frame whose length
  prefix is over the limit closes the connection (its stream lost step).
- Long-lived children are started in their own session; the spawner keeps their
  stdio for their whole life and relays their output to the connection attached to
  them (`spawner.agents`, `spawner.relay`), so a daemon can die and the next one attach.
- A child whose connection goes away is an orphan: a new connection may `adopt` it;
  one unclaimed for its orphan grace gets TERM, then KILL `KILL_AFTER_S` later. No
  child outlives the spawner's own shutdown.
- Bounded: `MAX_RUNS` run requests at once (waiting or running) per spawner;
  `MAX_CHILDREN` long-lived children; replay buffers per child and in all
  (`spawner.relay` states the policy at those bounds).
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import socket
import threading
import time
from typing import Any

from spawner import log
from spawner import protocol as p
from spawner.agents import MAX_CHILDREN, Agents, raise_file_limit
from spawner.children import KILL_AFTER_S, Child
from spawner.commands import run_command
from spawner.pools import Pool, PoolBusyError
from spawner.relay import DEFAULT_REPLAY_BOUND, DEFAULT_REPLAY_BUDGET

__all__ = ["KILL_AFTER_S", "MAX_CHILDREN", "MAX_RUNS", "Spawner"]

MAX_RUNS = 4096
MAX_OUTPUT_CAP = 8 * 1024 * 1024
SHUTDOWN_GRACE_S = 3.0


class Spawner:
    def __init__(
        self,
        listener: socket.socket,
        pools: dict[str, Pool],
        *,
        orphan_grace: float,
        idle_exit: float | None,
        replay_bound: int = DEFAULT_REPLAY_BOUND,
        replay_budget: int = DEFAULT_REPLAY_BUDGET,
    ) -> None:
        self.listener = listener
        self.pools = pools
        self.idle_exit = idle_exit
        self.lock = threading.Lock()  # guards connections and counters
        self.connections: set[Connection] = set()
        self.runs = 0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.agents = Agents(self._selector, self.wake, orphan_grace=orphan_grace, replay_bound=replay_bound, replay_budget=replay_budget)
        self._stopping = False
        self._idle_since = time.monotonic()

    # -- the main loop ------------------------------------------------------------------

    def serve_forever(self) -> None:
        raise_file_limit()
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        timeout = 1.0
        while not self._stopping:
            for key, _ in self._selector.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                else:
                    child, role = key.data
                    for owner, event in self.agents.on_ready(child, role, key.fd):
                        owner.send(event)
            timeout = self.agents.tend()
            if self._idle_too_long():
                log.info("idle for %.0f s with no daemon and no children; exiting", self.idle_exit)
                break
        self._shutdown()

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self._stopping = True

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn = Connection(self, sock)
        with self.lock:
            self.connections.add(conn)
        threading.Thread(target=conn.serve, name="conn", daemon=True).start()

    def _idle_too_long(self) -> bool:
        if self.idle_exit is None:
            return False
        with self.lock:
            busy = bool(self.connections or self.runs or self.agents.children)
        if busy:
            self._idle_since = time.monotonic()
        return time.monotonic() - self._idle_since >= self.idle_exit

    def _shutdown(self) -> None:
        self.agents.stop_all(SHUTDOWN_GRACE_S)
        self.listener.close()

    # -- requests (called from connection threads) -------------------------------------------

    def disown(self, conn: Connection) -> None:
        with self.lock:
            self.connections.discard(conn)
        self.agents.disown(conn)

    def statistics(self) -> dict[str, Any]:
        with self.lock:
            connections, runs = len(self.connections), self.runs
        return {
            "pid": os.getpid(),
            "rss_kib": _rss_kib(),
            "pools": {name: pool.statistics() for name, pool in self.pools.items()},
            **self.agents.statistics(),
            "connections": connections,
            "runs_in_flight": runs,
        }

    def start_run(self, message: dict[str, Any], conn: Connection) -> None:
        """Validate now (errors reply at once); run in a worker thread that replies when done."""
        argv = p.check_argv(message)
        request = {
            "argv": argv,
            "cwd": p.check_cwd(message),
            "env": p.check_env(message),
            "stdin": p.unb64(message.get("stdin_b64") or "", "'stdin_b64'"),
            "timeout": p.check_number(message, "timeout", 60.0, 0.001, 86400.0),
            "output_cap": int(p.check_number(message, "output_cap", 1024 * 1024, 0, MAX_OUTPUT_CAP)),
        }
        pool = self.pools[p.check_choice(message, "pool", p.POOLS, "other")]
        with self.lock:
            if self.runs >= MAX_RUNS:
                raise p.FrameError(f"the spawner already has {MAX_RUNS} commands waiting or running; retry later")
            self.runs += 1
        threading.Thread(target=self._run, args=(message["id"], pool, request, conn), daemon=True).start()

    def _run(self, request_id: int, pool: Pool, request: dict[str, Any], conn: Connection) -> None:
        try:
            try:
                waited = pool.acquire()
            except PoolBusyError as exc:
                conn.send({"id": request_id, "ok": False, "error": f"{exc}; retry later"})
                return
            try:
                reply = run_command(**request)
            except OSError as exc:
                conn.send({"id": request_id, "ok": False, "error": f"could not start {request['argv'][0]!r}: {exc.strerror or exc}"})
                return
            finally:
                pool.release()
            conn.send({"id": request_id, "ok": True, "wait": waited, **reply})
        finally:
            with self.lock:
                self.runs -= 1


class Connection:
    """One client connection: a reader thread, and sends serialized by a lock."""

    def __init__(self, server: Spawner, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self._send_lock = threading.Lock()
        self._closed = False

    def gone(self) -> bool:
        """True once the peer has closed its end, even before the reader thread has seen the
        EOF (a new daemon may ask to adopt sooner than that)."""
        if self._closed:
            return True
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLIN | select.POLLRDHUP)
            events = poller.poll(0)
        except (OSError, ValueError):  # closed under us
            return True
        return any(ev & (select.POLLHUP | select.POLLRDHUP | select.POLLERR) for _, ev in events)

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        frame = p.encode_frame(message)
        with self._send_lock:
            if self._closed:
                return
            try:
                if fds:
                    sent = socket.send_fds(self.sock, [frame], fds)
                    self.sock.sendall(frame[sent:])
                else:
                    self.sock.sendall(frame)
            except OSError:
                self._closed = True  # the reader thread sees the EOF and disowns

    def serve(self) -> None:
        decoder = p.FrameDecoder()
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                decoder.feed(data)
                if not self._handle_frames(decoder):
                    break
        finally:
            with self._send_lock:
                self._closed = True
            self.sock.close()
            self.server.disown(self)
            self.server.wake()

    def _handle_frames(self, decoder: p.FrameDecoder) -> bool:
        while True:
            try:
                message = decoder.next_frame()
            except p.FrameError as exc:
                self.send({"id": None, "ok": False, "error": f"bad frame: {exc}"})
                if exc.fatal:
                    return False
                continue
            if message is None:
                return True
            self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            self.send({"id": None, "ok": False, "error": "bad request: 'id' must be an integer"})
            return
        op = message.get("op")
        agents = self.server.agents
        fds: list[int] = []
        close: list[int] = []
        handed: Child | None = None
        try:
            if op == "run":
                self.server.start_run(message, self)
                return
            if op == "spawn":
                handed, reply, fds, close = agents.spawn(message, self)
            elif op == "attach":
                handed, reply, fds, close = agents.attach(message, self)
            elif op == "ack":
                reply = agents.ack(message, self)
            elif op == "close_stdin":
                reply = agents.close_stdin(message, self)
            elif op == "signal":
                reply = agents.signal(message)
            elif op == "adopt":
                reply = agents.adopt(message, self)
            elif op == "stats":
                reply = self.server.statistics()
            elif op == "ping":
                reply = {"pid": os.getpid()}
            else:
                raise p.FrameError(
                    f"unknown op {op!r}; use run, spawn, attach, ack, close_stdin, signal, adopt, stats or ping"
                )
        except p.FrameError as exc:
            self.send({"id": request_id, "ok": False, "error": f"bad {op} request: {exc}"})
            return
        except OSError as exc:
            argv0 = message.get("argv", ["?"])[0]
            self.send({"id": request_id, "ok": False, "error": f"could not start {argv0!r}: {exc.strerror or exc}"})
            return
        try:
            self.send({"id": request_id, "ok": True, **reply}, fds)
        finally:
            for fd in close:  # the relay read ends now live in the requester
                os.close(fd)
            if handed is not None:
                agents.watch(handed)


def _rss_kib() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0
