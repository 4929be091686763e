"""The spawner's long-lived children (agents): starting them, relaying their output, and
handing them from one daemon to the next.

Threads: requests (spawn, attach, ack, adopt, signal, close_stdin) arrive on connection
threads; all descriptor I/O and every close of a watched descriptor happen on the main
thread, in `Agents.on_ready` and `Agents.tend`, which the spawner's selector loop calls.
One lock guards the table and every child's relays, so a request never sees a relay
half-updated.

Rules:
- A spawned child's stdin write end, stdout and stderr stay the spawner's for the
  child's life (`spawner.children`); the daemon gets a dup of stdin, the read ends of
  fresh relay pipes and a pidfd. A daemon that dies loses its pipes, never the child's.
- `attach` gives the owner new relay pipes fed from the start of the replay buffer
  (``start``: the offset of the first byte it will read; ``end``: what had been read
  from the child by then; ``complete``: nothing after the last ack was dropped).
- `ack` forgets the output before an offset and may replace the child's ``meta``.
- `adopt` hands a daemon the orphans whose ``meta`` has every key and value of its
  ``match``: it owns them from then on; the others are left alone, and so are orphans
  already being stopped (their grace ran out).
- Exits go to the owner as ``exit`` events (again after an attach to a child already
  gone). See `spawner.children` for when a child is forgotten and how orphans stop.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from spawner import log
from spawner import protocol as p
from spawner.children import KILL_AFTER_S, Child, Owner
from spawner.commands import kill_group
from spawner.relay import Budget
from spawner.scope import scoped_argv, scopes_work, valid_unit

MAX_CHILDREN = 4096
_SIGNALS = {name: getattr(signal, "SIG" + name) for name in p.SIGNALS}
# The file limit the spawner found, given back to the children it starts (it raises its
# own: each child costs it six descriptors).
_CHILD_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_file_limit() -> None:
    soft, hard = _CHILD_NOFILE
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


class Agents:
    def __init__(self, selector: selectors.BaseSelector, wake: Callable[[], None], *, orphan_grace: float, replay_bound: int, replay_budget: int) -> None:
        self._selector = selector
        self._wake = wake
        self.orphan_grace = orphan_grace
        self.replay_bound = replay_bound
        self.budget = Budget(replay_budget)
        self.lock = threading.Lock()
        self.children: dict[int, Child] = {}
        self._next_child = 1
        self._dirty: set[Child] = set()
        self._closing: list[tuple[Child, int]] = []
        self._exited: set[Child] = set()
        # Detached children not read only because the budget is spent: watched again once
        # it has room.
        self._budget_held: set[Child] = set()
        self._next_sweep = 0.0

    # -- requests (connection threads) ------------------------------------------------------

    def spawn(self, message: dict[str, Any], conn: Owner) -> tuple[Child, dict[str, Any], list[int], list[int]]:
        """Start a child; returns it, the reply, the fds to send and those to close after."""
        argv = p.check_argv(message)
        cwd, env = p.check_cwd(message), p.check_env(message)
        tag = message.get("tag", "")
        if not isinstance(tag, str):
            raise p.FrameError("'tag' must be a string")
        meta = p.check_meta(message)
        grace = p.check_number(message, "orphan_grace", self.orphan_grace, 0, 86400)
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
        with contextlib.suppress(OSError, ValueError):
            resource.prlimit(popen.pid, resource.RLIMIT_NOFILE, _CHILD_NOFILE)
        pidfd = os.pidfd_open(popen.pid)
        with self.lock:
            child = Child(
                self._next_child, popen, pidfd, (stdin_w, stdout_r, stderr_r),
                tag=tag, meta=meta, grace=grace, owner=conn, bound=self.replay_bound, budget=self.budget,
            )
            self._next_child += 1
            self.children[child.id] = child
            send, close = self._attach_locked(child)
        return child, {"child": child.id, "pid": popen.pid, "fds": 4, "scope": scope}, send, close

    def attach(self, message: dict[str, Any], conn: Owner) -> tuple[Child, dict[str, Any], list[int], list[int]]:
        with self.lock:
            child = self._owned(message, conn)
            send, close = self._attach_locked(child)
            reply = {**child.describe(), "fds": 4}
        return child, reply, send, close

    def _attach_locked(self, child: Child) -> tuple[list[int], list[int]]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        for previous in (child.out.attach(out_w), child.err.attach(err_w)):
            if previous is not None:
                self._closing.append((child, previous))
        child.attached = True  # relaying starts at `watch`, once the reply is out
        close = [out_r, err_r]
        stdin = child.stdin
        if stdin is None:  # closed on request: hand over a pipe nobody reads (writes fail)
            stdin_r, stdin = os.pipe()
            os.close(stdin_r)
            close.append(stdin)
        return [stdin, out_r, err_r, child.pidfd], close

    def watch(self, child: Child) -> None:
        """Start relaying (after the reply went out, so the requester hears of the child
        before its exit); tell the owner at once if the child is already gone."""
        with self.lock:
            self._dirty.add(child)
            exited, owner = child.returncode, child.owner
        self._wake()
        if exited is not None and owner is not None:
            owner.send({"event": "exit", "child": child.id, "pid": child.popen.pid, "returncode": exited})

    def ack(self, message: dict[str, Any], conn: Owner) -> dict[str, Any]:
        offset = message.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise p.FrameError("'offset' must be a whole number of bytes")
        meta = p.check_meta(message) if "meta" in message else None
        with self.lock:
            child = self._owned(message, conn)
            try:
                child.out.ack(offset)
            except ValueError as exc:
                raise p.FrameError(str(exc)) from None
            if meta is not None:
                child.meta = meta
            self._dirty.add(child)
            reply = {"start": child.out.base, "end": child.out.end}
        self._wake()
        return reply

    def close_stdin(self, message: dict[str, Any], conn: Owner) -> dict[str, Any]:
        with self.lock:
            self._owned(message, conn).close_stdin()
        return {}

    def signal(self, message: dict[str, Any]) -> dict[str, Any]:
        child_id = message.get("child")
        sig = _SIGNALS[p.check_choice(message, "signal", p.SIGNALS)]
        with self.lock:  # reaping takes the lock too, so the pid cannot be reused under us
            child = self.children.get(child_id) if isinstance(child_id, int) else None
            if child is None or child.returncode is not None:
                return {"delivered": False}
            kill_group(child.popen.pid, sig)
        return {"delivered": True}

    def adopt(self, message: dict[str, Any], conn: Owner) -> dict[str, Any]:
        match = message.get("match")
        if match is not None and not isinstance(match, dict):
            raise p.FrameError("'match' must be an object of meta keys and values")
        with self.lock:
            gone = {c.owner for c in self.children.values() if c.owner is not None and c.owner is not conn and c.owner.gone()}
            for owner in gone:  # its reader thread has not seen the EOF yet
                self._disown_locked(owner)
            # An orphan whose grace is over is stopped, not handed over: with a grace of 0
            # the agents stop with their daemon even when the next one asks before a sweep.
            self._stop_unclaimed_orphans(time.time())
            orphans = [  # not those being stopped for want of a daemon: too late for them
                c for c in self.children.values()
                if c.owner is None and c.term_sent_at is None and all(c.meta.get(k) == v for k, v in (match or {}).items())
            ]
            for child in orphans:
                child.owner, child.orphaned_at = conn, None
        return {"children": [c.describe() for c in orphans]}

    def disown(self, conn: Owner) -> None:
        """The connection is gone: its children become orphans (their output is kept)."""
        with self.lock:
            self._disown_locked(conn)
        self._wake()

    def _disown_locked(self, conn: Owner) -> None:
        now = time.time()
        for child in self.children.values():
            if child.owner is conn:
                child.owner, child.orphaned_at, child.attached = None, now, False
                for previous in (child.out.detach(), child.err.detach()):
                    if previous is not None:
                        self._closing.append((child, previous))
                self._dirty.add(child)
                if child.returncode is not None:
                    self._exited.add(child)
        self._next_sweep = 0.0  # a grace of 0 starts now, not at the next half-second sweep

    def _owned(self, message: dict[str, Any], conn: Owner) -> Child:
        child_id = message.get("child")
        child = self.children.get(child_id) if isinstance(child_id, int) and not isinstance(child_id, bool) else None
        if child is None or child.owner is not conn:
            raise p.FrameError(f"child {child_id!r} is not one of this connection's; adopt it first")
        return child

    def statistics(self) -> dict[str, Any]:
        with self.lock:
            children = list(self.children.values())
        return {
            "children": len(children),
            "orphans": sum(1 for c in children if c.owner is None),
            "replay_bytes": self.budget.used,
            "replay_budget": self.budget.limit,
            "replay_incomplete": sum(1 for c in children if not c.out.complete),
        }

    # -- the main thread ----------------------------------------------------------------------

    def on_ready(self, child: Child, role: str, fd: int) -> list[tuple[Owner, dict[str, Any]]]:
        """Descriptor ``fd`` of ``child`` is ready; returns exit events to send (unlocked)."""
        events: list[tuple[Owner, dict[str, Any]]] = []
        with self.lock:
            if child.id not in self.children:
                return events
            if role == "pid":
                self._dirty.add(child)
                returncode = child.popen.poll()
                if returncode is None:
                    return events
                child.returncode, child.exited_at = returncode, time.time()
                self._exited.add(child)
                if child.owner is not None:
                    events.append((child.owner, {"event": "exit", "child": child.id, "pid": child.popen.pid, "returncode": returncode}))
                else:
                    log.info("orphan %s (pid %d, %s) exited with %s", child.id, child.popen.pid, child.tag, returncode)
                return events
            relay = child.out if role.startswith("out") else child.err
            if role.endswith("sink"):
                if relay.sink == fd and relay.write():  # (a request may have replaced the sink)
                    self._discard(child, relay.detach())
            elif relay.source == fd:
                if relay.read():
                    self._discard(child, relay.take_source())
                # Forward at once: most output fits the sink, so it is never watched for
                # writing (two fewer epoll changes per line an agent writes).
                if relay.sink is not None and relay.wants_write() and relay.write():
                    self._discard(child, relay.detach())
            if relay.watching() != (relay.source in child.registered, relay.sink in child.registered):
                self._dirty.add(child)  # what is watched must change
        return events

    def tend(self) -> float:
        """Close, drain, forget and stop what is due; watch what is wanted. Returns how soon
        to come back (seconds)."""
        with self.lock:
            now = time.time()
            for child, fd in self._closing:
                self._discard(child, fd)
            self._closing.clear()
            for child in list(self._exited):
                if child.id not in self.children:
                    self._exited.discard(child)
                    continue
                if child.drained(now):
                    for relay in (child.out, child.err):
                        self._discard(child, relay.take_source())
                    if child.attached and child.owner is not None and child.sinks_done():
                        for relay in (child.out, child.err):
                            self._discard(child, relay.detach())
                    if child.forgettable(now):
                        self._forget(child)
                        continue
                self._dirty.add(child)
            if self._budget_held and self.budget.used < self.budget.limit:
                self._dirty |= self._budget_held
                self._budget_held.clear()
            for child in self._dirty:
                if child.id in self.children:
                    self._sync(child)
            self._dirty.clear()
            if now >= self._next_sweep:
                self._stop_unclaimed_orphans(now)
                self._next_sweep = now + 0.5
            return 0.1 if self._exited else 1.0

    def _sync(self, child: Child) -> None:
        out = child.out
        if out.sink is None and out.source is not None and not out.wants_read() and self.budget.used >= self.budget.limit:
            self._budget_held.add(child)
        want: dict[int, tuple[int, str]] = {}
        if child.returncode is None:
            want[child.pidfd] = (selectors.EVENT_READ, "pid")
        for name, relay in (("out", child.out), ("err", child.err)):
            if relay.source is not None and relay.wants_read():
                want[relay.source] = (selectors.EVENT_READ, name)
            if relay.sink is not None and relay.wants_write():
                want[relay.sink] = (selectors.EVENT_WRITE, name + "-sink")
        for fd in [fd for fd in child.registered if fd not in want]:
            self._selector.unregister(fd)
            del child.registered[fd]
        for fd, (events, role) in want.items():
            have = child.registered.get(fd)
            if have is None:
                self._selector.register(fd, events, (child, role))
            elif have != events:
                self._selector.modify(fd, events, (child, role))
            child.registered[fd] = events

    def _discard(self, child: Child, fd: int | None) -> None:
        if fd is None:
            return
        if child.registered.pop(fd, None) is not None:
            self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _forget(self, child: Child) -> None:
        for relay in (child.out, child.err):
            self._discard(child, relay.take_source())
            self._discard(child, relay.detach())
        self._discard(child, child.pidfd)
        child.close_stdin()
        child.out.release()
        self.children.pop(child.id, None)
        self._exited.discard(child)
        self._dirty.discard(child)
        self._budget_held.discard(child)

    def _stop_unclaimed_orphans(self, now: float) -> None:
        for child in self.children.values():
            if child.orphaned_at is None or child.returncode is not None:
                continue
            if child.term_sent_at is None and now - child.orphaned_at >= child.grace:
                log.info("no daemon claimed child %s (%s) in %.0f s; stopping it", child.id, child.tag, child.grace)
                kill_group(child.popen.pid, signal.SIGTERM)
                child.term_sent_at = now
            elif child.term_sent_at is not None and now - child.term_sent_at >= KILL_AFTER_S:
                kill_group(child.popen.pid, signal.SIGKILL)

    def stop_all(self, grace: float) -> None:
        """The spawner is stopping: TERM every child, KILL what is left after ``grace``."""
        with self.lock:
            live = [c for c in self.children.values() if c.returncode is None]
            for child in live:
                kill_group(child.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in live:
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(child.popen.pid, signal.SIGKILL)
                child.popen.wait()
