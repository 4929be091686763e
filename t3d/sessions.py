"""`open_sessions`: one task per live provider session, under one supervisor.

Effects for a thread go to that thread's session inbox (bounded: a session
`INBOX_SIZE` effects behind gets no more, and a turn start it cannot take
fails with the reason, so one stuck session never stalls the others). A session is created on the thread's
first effect that needs one and ends when it is told to stop or its thread
goes away. A session that fails unexpectedly is logged with its traceback,
its running turn is failed with the reason, and the other sessions go on:
one broken agent never takes the daemon down.

At shutdown every session either stops its agent or, when the daemon is meant to
leave agents running (``stop_at_exit()`` is False), the spawner can keep them
(`Child.detachable`) and the provider's session can take a process over after a
restart (`registry.Reattachable`), detaches: it stops reading, lets its writes
commit and leaves the agent to the next daemon. Once every session has ended, the turn
each stopped agent was running ends ``interrupted`` (``server_shutdown``), so the database
the daemon leaves has no turn running without an agent. At start-up `reattach` gives each
agent a previous daemon left (`t3d/restart.py`) a session that replays and
continues its open turn. This plumbing is provider-neutral; replaying a turn is
each provider session's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from t3d.config import Settings
from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.errors import DomainError, SpawnerError, StoreError
from t3d.pressure.readers import AgentProcess
from t3d.providers import registry
from t3d.providers.claude.session import BeforeTurn, SessionSpec
from t3d.providers.log_limit import LogLimiter
from t3d.providers.pipeline import WritePipeline
from t3d.providers.reattach import Reattach
from t3d.spawn.child import Orphan, Spawner
from t3d.startup_checks import missing_binary
from t3d.store.store import Store

log = logging.getLogger("t3d.sessions")

INBOX_SIZE = 64


@attrs.define
class _Live:
    inbox: trio.MemorySendChannel[ev.Effect]
    turn_id: str | None = None
    session: registry.AgentSession | None = None  # set once its task runs


class Sessions:
    def __init__(
        self,
        nursery: trio.Nursery,
        store: Store,
        spawner: Spawner,
        settings: Settings,
        clock: Callable[[], float],
        stop_at_exit: Callable[[], bool] = lambda: True,
    ) -> None:
        self._nursery = nursery
        self._store = store
        self._spawner = spawner
        self._settings = settings
        self._clock = clock
        self._stop_at_exit = stop_at_exit
        self._live: dict[str, _Live] = {}
        # Called by a session before each turn reaches its provider (the checkpoint baseline).
        self.before_turn: BeforeTurn | None = None

    @property
    def count(self) -> int:
        return len(self._live)

    async def dispatch(self, effect: ev.Effect) -> None:
        live = self._live.get(effect.thread_id)
        if isinstance(effect, ev.StartProviderTurn) and effect.provider_started:
            await self._admit_wake(live, effect)
            return
        if live is None:
            if isinstance(effect, ev.SteerProviderTurn):  # no agent runs the turn any more
                await self._requeue_steer(effect)
                return
            if not isinstance(effect, ev.StartProviderTurn):
                return  # nothing runs for this thread: nothing to interrupt, answer or stop
            live = await self._open(effect)
            if live is None:
                return
        if isinstance(effect, ev.StopProviderSession):  # the session ends once its inbox is drained
            await live.inbox.aclose()
            del self._live[effect.thread_id]
            return
        if isinstance(effect, ev.StartProviderTurn):
            live.turn_id = effect.turn_id
        try:  # never wait on one session: the worker serves every thread
            live.inbox.send_nowait(effect)
        except trio.WouldBlock:
            log.warning(
                "thread %s: its provider session is %d effects behind; dropped %s",
                effect.thread_id,
                INBOX_SIZE,
                type(effect).__name__,
            )
            if isinstance(effect, ev.StartProviderTurn):
                await self._fail_turn(
                    effect.turn_id,
                    "the thread's provider session is not keeping up; interrupt or archive the thread, then retry",
                    "session_backlog",
                )
            elif isinstance(effect, ev.SteerProviderTurn):
                await self._requeue_steer(effect)

    async def _admit_wake(self, live: _Live | None, effect: ev.StartProviderTurn) -> None:
        """A turn the provider started itself may run: its session's reader waits for this.
        Handed over directly (not through the bounded inbox, which it must never wait behind)."""
        session = None if live is None else live.session
        admit = getattr(session, "admit", None)
        if live is not None and admit is not None and await admit(effect):
            live.turn_id = effect.turn_id
            return
        if live is not None and session is None:  # its task has not run yet: the inbox
            live.turn_id = effect.turn_id
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                live.inbox.send_nowait(effect)
                return
        # Its agent is gone (stopped, restarted, replaced): nothing will run it.
        await self._finish_turn(
            effect.turn_id, "cancelled", "the agent that started this turn is no longer running", "provider_gone"
        )

    async def _requeue_steer(self, effect: ev.SteerProviderTurn) -> None:
        with contextlib.suppress(DomainError):
            await self._store.record(c.RequeueSteer(effect.thread_id, effect.item_id, effect.steer_id, effect.text))

    async def _open(self, effect: ev.StartProviderTurn) -> _Live | None:
        context = await self._store.thread_context(effect.thread_id)
        if context is None:
            return None
        thread, project, resume = context
        cwd = thread.get("worktree_path") or project["path"]
        if not await trio.Path(cwd).is_dir():
            await self._fail_turn(
                effect.turn_id,
                f"the project directory {cwd} does not exist; recreate it or create the project again with an existing path",
                "bad_cwd",
            )
            return None
        problem = await trio.to_thread.run_sync(missing_binary, thread["provider"], self._settings, os.environ)
        if problem is not None:  # say how to install it, not just "No such file or directory"
            await self._fail_turn(effect.turn_id, f"{thread['provider']}: {problem}", "provider_start_failed")
            return None
        return self._start(self._spec(thread, cwd, resume), None, None)

    def _start(self, spec: SessionSpec, turn_id: str | None, reattach: Reattach | None) -> _Live:
        send, receive = trio.open_memory_channel[ev.Effect](INBOX_SIZE)
        live = _Live(send, turn_id=turn_id)
        self._live[spec.thread_id] = live
        self._nursery.start_soon(self._supervise, spec, receive, live, reattach)
        return live

    async def reattach(self, orphan: Orphan) -> bool:
        """Give an agent a previous daemon left (its session is live in the database) a
        session that takes it over; False (the agent stopped, its turn failed) if that
        cannot be done."""
        thread_id = str(orphan.meta.get("thread_id"))
        context = await self._store.reattach_context(thread_id)
        if context is None or thread_id in self._live or context.thread.get("provider") not in registry.REATTACHABLE:
            await self._spawner.stop_orphan(orphan)
            return False
        try:
            child = await self._spawner.attach(orphan)
        except SpawnerError as exc:
            log.error("thread %s: could not reattach to its agent (pid %d): %s", thread_id, orphan.pid, exc)
            await self._spawner.stop_orphan(orphan)
            if context.turn is not None:
                await self._fail_turn(
                    context.turn.id,
                    f"the daemon restarted and could not take its agent over ({exc}); start a new turn to continue",
                    "reattach_failed",
                )
            return False
        cwd = context.thread.get("worktree_path") or context.project["path"]
        spec = self._spec(context.thread, cwd, context.resume)
        turn_id = None if context.turn is None else context.turn.id
        reattach = Reattach(child, context.turn, context.user_text, context.requests, context.items, context.tasks)
        self._start(spec, turn_id, reattach)
        return True

    def _spec(self, thread: dict[str, Any], cwd: str, resume: str | None) -> SessionSpec:
        provider = thread["provider"]
        launch = registry.launch(provider, self._settings, thread.get("runtime_mode"))
        env = {**launch.env_defaults, **os.environ, **launch.env}
        return SessionSpec(
            thread_id=thread["id"],
            provider=provider,
            argv=launch.argv,
            cwd=cwd,
            env=env,
            model=thread.get("model"),
            permission_mode=launch.permission_mode,
            resume=resume,
            interrupt_timeout=self._settings.interrupt_timeout,
            idle_timeout=self._settings.provider_idle_timeout,
            silence_timeout=self._settings.turn_silence_timeout,
            scopes=self._settings.agent_scopes == "auto",
            before_turn=self.before_turn,
        )

    async def _supervise(
        self,
        spec: SessionSpec,
        inbox: trio.MemoryReceiveChannel[ev.Effect],
        live: _Live,
        reattach: Reattach | None,
    ) -> None:
        rejected = LogLimiter(log, f"thread {spec.thread_id}", level=logging.INFO)
        try:
            pipeline = WritePipeline(self._store.send, self._store.record, functools.partial(_not_recorded, rejected))
            session = live.session = registry.open_session(spec, pipeline.write, self._spawner, self._clock, self._settings, pipeline)
            if isinstance(session, registry.Reattachable):
                session.detach_on_cancel = lambda: not self._stop_at_exit()
                await session.run(inbox, reattach)
            else:
                await session.run(inbox)
            await pipeline.drain()
        except Exception as exc:  # the supervision boundary of one session
            log.error("thread %s: provider session failed", spec.thread_id, exc_info=exc)
            if live.turn_id is not None:
                await self._fail_turn(
                    live.turn_id,
                    f"internal error in the {spec.provider} session: {exc!r}; start a new turn to retry",
                    "session_crashed",
                )
        finally:
            rejected.flush()
            if self._live.get(spec.thread_id) is live:
                del self._live[spec.thread_id]

    def agents(self) -> list[AgentProcess]:
        """Every live provider process, with its thread (for the heaviest-agents list)."""
        found = []
        for thread_id, live in self._live.items():
            child = None if live.session is None else live.session.process
            if child is not None and child.returncode is None:
                found.append(AgentProcess(thread_id, child.pid, child.scope))
        return found

    async def force_stop(self, thread_id: str) -> dict[str, Any]:
        """Kill the thread's provider process group through the spawner (TERM, the grace
        period, KILL); its running turn ends ``cancelled`` (``force_stop``). Other threads'
        agents are untouched. Raises DomainError when the thread has nothing to stop."""
        live = self._live.get(thread_id)
        child = None if live is None or live.session is None else live.session.process
        if live is None or live.session is None or child is None:
            if await self._store.thread_context(thread_id) is None:
                raise DomainError("not_found", f"thread {thread_id!r} does not exist; list threads with GET /api/shell")
            if live is not None and live.turn_id is not None:  # starting, no process yet
                await self._finish_turn(live.turn_id, "cancelled", "force-stopped by the user before its agent started", "force_stop")
                return {"thread_id": thread_id, "pid": None, "exit_code": None}
            raise DomainError("conflict", f"thread {thread_id!r} has no running agent to stop")
        pid = child.pid
        log.warning("thread %s: force stop of its provider (process group %d)", thread_id, pid)
        code = await live.session.force_stop(self._settings.force_stop_grace)
        return {"thread_id": thread_id, "pid": pid, "exit_code": code}

    async def _finish_turn(self, turn_id: str, status: str, error: str, reason: str) -> None:
        with contextlib.suppress(DomainError):  # the turn ended or went away meanwhile
            await self._store.record(c.FinishTurn(turn_id, status, error, reason))

    async def _fail_turn(self, turn_id: str, error: str, reason: str) -> None:
        await self._finish_turn(turn_id, "failed", error, reason)

    async def stop_all(self, *, detach: bool = False) -> list[str]:
        """Ask every session to stop, all at once (a session ending meanwhile is fine);
        a session whose inbox is full stops when it reaches the inbox's end. With
        ``detach``, sessions whose agent can outlive the daemon leave it running.
        Returns the last turn of each session told to stop its agent (`end_stopped_turns`)."""
        lives, self._live = self._live, {}
        stopped = []
        for thread_id, live in lives.items():
            session = live.session
            child = None if session is None else session.process
            if detach and isinstance(session, registry.Reattachable) and child is not None and child.detachable:
                session.detach()
            else:
                if live.turn_id is not None:
                    stopped.append(live.turn_id)
                with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    live.inbox.send_nowait(ev.StopProviderSession(thread_id))
            await live.inbox.aclose()
        return stopped

    async def end_stopped_turns(self, turn_ids: list[str]) -> None:
        """Once the sessions have stopped at shutdown: a turn whose agent was stopped with the
        daemon ends now (a turn that ended already is left as it is), not at the next start;
        if the database cannot take it, the next start's recovery closes the turn."""
        for turn_id in turn_ids:
            try:
                await self._finish_turn(
                    turn_id,
                    "interrupted",
                    "the daemon shut down and stopped this turn's agent; start a new turn to continue",
                    "server_shutdown",
                )
            except StoreError as exc:
                log.warning("turn %s: could not record its end at shutdown (%s); the next start closes it", turn_id, exc)


def _not_recorded(rejected: LogLimiter, command: c.Command, error: DomainError) -> None:
    """A provider write the domain rejected (e.g. the thread was deleted meanwhile, or a
    replay after a restart opened a request that is already open): logged, not fatal."""
    rejected.warning(f"{type(command).__name__} not recorded: {error}")


@asynccontextmanager
async def open_sessions(
    store: Store,
    spawner: Spawner,
    settings: Settings,
    clock: Callable[[], float] = time.time,
    stop_at_exit: Callable[[], bool] = lambda: True,
) -> AsyncIterator[Sessions]:
    """The sessions' supervisor. At exit ``stop_at_exit()`` says whether agents are stopped
    or left running for the next daemon (where the spawner and the provider allow it)."""
    stopped: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            sessions = Sessions(nursery, store, spawner, settings, clock, stop_at_exit)
            try:
                yield sessions
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    stopped = await sessions.stop_all(detach=not stop_at_exit())
    finally:  # every session has ended (its agent stopped or left running)
        if stopped:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await sessions.end_stopped_turns(stopped)
