"""The spawner sidecar: starts every process so the daemon never forks.

Threads: the main thread runs one selector loop over the listening socket,
the pidfds of long-lived children (their exits) and a wake pipe (signals,
new children); each connection has a reader thread; each `run` request has
a worker thread that waits for a slot in its pool.

Rules:
- Bad frames get an error reply naming the problem; only a frame whose length
  prefix is over the limit closes the connection (its stream lost step).
- Long-lived children are started in their own session; their stdin, stdout,
  stderr and a pidfd go back to the requester with SCM_RIGHTS, and the
  spawner keeps only the pidfd. Their exits are reported to the connection
  that owns them.
- A child whose connection goes away is an orphan: a new connection may
  `adopt` it; one unclaimed for ``orphan_grace`` seconds gets TERM, then KILL
  `KILL_AFTER_S` later. No child outlives the spawner's own shutdown.
- Bounded: `MAX_RUNS` run requests at once (waiting or running) per spawner;
  `MAX_CHILDREN` long-lived children.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from spawner import log
from spawner import protocol as p
from spawner.commands import kill_group, run_command
from spawner.pools import Pool, PoolBusyError
from spawner.scope import scoped_argv, scopes_work, valid_unit

MAX_RUNS = 4096
MAX_CHILDREN = 4096
MAX_OUTPUT_CAP = 8 * 1024 * 1024
KILL_AFTER_S = 5.0
SHUTDOWN_GRACE_S = 3.0
_SIGNALS = {name: getattr(signal, "SIG" + name) for name in p.SIGNALS}


class Child:
    def __init__(self, child_id: int, popen: subprocess.Popen[bytes], pidfd: int, tag: str, owner: Connection) -> None:
        self.id = child_id
        self.popen = popen
        self.pidfd = pidfd
        self.tag = tag
        self.owner: Connection | None = owner
        self.argv0 = str(popen.args[0])  # type: ignore[index]
        self.started = time.time()
        self.orphaned_at: float | None = None
        self.term_sent_at: float | None = None

    def describe(self) -> dict[str, Any]:
        return {"child": self.id, "pid": self.popen.pid, "tag": self.tag, "argv0": self.argv0, "started": self.started}


class Spawner:
    def __init__(self, listener: socket.socket, pools: dict[str, Pool], *, orphan_grace: float, idle_exit: float | None) -> None:
        self.listener = listener
        self.pools = pools
        self.orphan_grace = orphan_grace
        self.idle_exit = idle_exit
        self.lock = threading.Lock()  # guards children (reaping vs signalling), connections, counters
        self.children: dict[int, Child] = {}
        self.connections: set[Connection] = set()
        self.runs = 0
        self._next_child = 1
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._new_pidfds: list[Child] = []
        self._stopping = False
        self._idle_since = time.monotonic()

    # -- the main loop ------------------------------------------------------------------

    def serve_forever(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._stopping:
            for key, _ in self._selector.select(1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                else:
                    self._reap(key.data)
            self._register_new_children()
            self._stop_unclaimed_orphans()
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

    def _register_new_children(self) -> None:
        with self.lock:
            fresh, self._new_pidfds = self._new_pidfds, []
        for child in fresh:
            self._selector.register(child.pidfd, selectors.EVENT_READ, child)

    def _reap(self, child: Child) -> None:
        with self.lock:
            returncode = child.popen.poll()
            if returncode is None:
                return
            self.children.pop(child.id, None)
            owner = child.owner
        self._selector.unregister(child.pidfd)
        os.close(child.pidfd)
        if owner is not None:
            owner.send({"event": "exit", "child": child.id, "pid": child.popen.pid, "returncode": returncode})
        else:
            log.info("orphan %s (pid %d, %s) exited with %s", child.id, child.popen.pid, child.tag, returncode)

    def _stop_unclaimed_orphans(self) -> None:
        now = time.time()
        with self.lock:
            for child in self.children.values():
                if child.orphaned_at is None:
                    continue
                if child.term_sent_at is None and now - child.orphaned_at >= self.orphan_grace:
                    log.info("no daemon claimed child %s (%s) in %.0f s; stopping it", child.id, child.tag, self.orphan_grace)
                    kill_group(child.popen.pid, signal.SIGTERM)
                    child.term_sent_at = now
                elif child.term_sent_at is not None and now - child.term_sent_at >= KILL_AFTER_S:
                    kill_group(child.popen.pid, signal.SIGKILL)

    def _idle_too_long(self) -> bool:
        if self.idle_exit is None:
            return False
        with self.lock:
            busy = bool(self.connections or self.children or self.runs)
        if busy:
            self._idle_since = time.monotonic()
        return time.monotonic() - self._idle_since >= self.idle_exit

    def _shutdown(self) -> None:
        with self.lock:
            live = list(self.children.values())
            for child in live:
                kill_group(child.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for child in live:
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(child.popen.pid, signal.SIGKILL)
                child.popen.wait()
        self.listener.close()

    # -- requests (called from connection threads) -------------------------------------------

    def spawn(self, message: dict[str, Any], conn: Connection) -> tuple[Child, dict[str, Any], list[int]]:
        argv = p.check_argv(message)
        cwd, env = p.check_cwd(message), p.check_env(message)
        tag = message.get("tag", "")
        if not isinstance(tag, str):
            raise p.FrameError("'tag' must be a string")
        scope = message.get("scope")
        if scope is not None and not (isinstance(scope, str) and valid_unit(scope)):
            raise p.FrameError("'scope' must be a unit name of letters, digits and :_.-")
        if scope is not None and not scopes_work():
            scope = None  # no working systemd here: the child runs in the spawner's cgroup
        if scope is not None:
            argv = scoped_argv(argv, scope)
        with self.lock:
            if len(self.children) >= MAX_CHILDREN:
                raise p.FrameError(f"the spawner already runs {MAX_CHILDREN} children; stop some first")
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours, theirs = [stdin_w, stdout_r, stderr_r], [stdin_r, stdout_w, stderr_w]
        try:
            popen = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin_r, stdout=stdout_w, stderr=stderr_w, start_new_session=True)
        except OSError:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        pidfd = os.pidfd_open(popen.pid)
        with self.lock:
            child = Child(self._next_child, popen, pidfd, tag, conn)
            self._next_child += 1
            self.children[child.id] = child
        return child, {"child": child.id, "pid": popen.pid, "fds": 4, "scope": scope}, [*ours, pidfd]

    def watch(self, child: Child) -> None:
        """Start watching for the child's exit: only after its spawn reply went out, so
        the requester always hears of the child before it hears of its exit."""
        with self.lock:
            self._new_pidfds.append(child)
        self.wake()

    def signal(self, message: dict[str, Any]) -> dict[str, Any]:
        child_id = message.get("child")
        sig = _SIGNALS[p.check_choice(message, "signal", p.SIGNALS)]
        with self.lock:  # reaping takes the lock too, so the pid cannot be reused under us
            child = self.children.get(child_id) if isinstance(child_id, int) else None
            if child is None or child.popen.returncode is not None:
                return {"delivered": False}
            kill_group(child.popen.pid, sig)
        return {"delivered": True}

    def adopt(self, conn: Connection) -> dict[str, Any]:
        with self.lock:
            orphans = [c for c in self.children.values() if c.owner is None]
            for child in orphans:
                child.owner, child.orphaned_at = conn, None
        return {"children": [c.describe() for c in orphans]}

    def disown(self, conn: Connection) -> None:
        with self.lock:
            self.connections.discard(conn)
            for child in self.children.values():
                if child.owner is conn:
                    child.owner, child.orphaned_at = None, time.time()

    def statistics(self) -> dict[str, Any]:
        with self.lock:
            children = len(self.children)
            orphans = sum(1 for c in self.children.values() if c.owner is None)
            connections, runs = len(self.connections), self.runs
        return {
            "pid": os.getpid(),
            "rss_kib": _rss_kib(),
            "pools": {name: pool.statistics() for name, pool in self.pools.items()},
            "children": children,
            "orphans": orphans,
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
        fds: list[int] = []
        spawned: Child | None = None
        try:
            if op == "run":
                self.server.start_run(message, self)
                return
            if op == "spawn":
                spawned, reply, fds = self.server.spawn(message, self)
            elif op == "signal":
                reply = self.server.signal(message)
            elif op == "adopt":
                reply = self.server.adopt(self)
            elif op == "stats":
                reply = self.server.statistics()
            elif op == "ping":
                reply = {"pid": os.getpid()}
            else:
                raise p.FrameError(f"unknown op {op!r}; use run, spawn, signal, adopt, stats or ping")
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
            for fd in fds[:3]:  # the pipes now live in the requester; the pidfd stays ours
                os.close(fd)
            if spawned is not None:
                self.server.watch(spawned)


def _rss_kib() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0
