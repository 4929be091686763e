"""What every provider session does the same way, whatever its CLI speaks: it takes its
effects from the inbox one at a time, in order (after taking over the agent a restart
left, if any), it records each of its processes as a `ProviderSession` row, it commits
after every pending streaming update (`_commit`), and it does not end before a process it
stopped for being idle has recorded its exit.

`ClaudeSession` and `CodexSession` mix this in; they supply the handlers it names.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.domain.model import ProviderSession, TurnItem

if TYPE_CHECKING:
    from t3d.providers.claude.process import ClaudeProcess
    from t3d.providers.claude.session import SessionSpec
    from t3d.providers.coalesce import ItemCoalescer
    from t3d.providers.reattach import Reattach

# How long a stopping session waits for its process's exit to be recorded.
EXIT_RECORD_S = 5.0

class SessionBase:
    spec: SessionSpec
    _resume: str | None
    _clock: Callable[[], float]
    _write: Callable[[c.Command], Awaitable[object]]  # a command to the store, now
    _reattach: Callable[[trio.Nursery, Reattach], Awaitable[None]]
    _start_turn: Callable[[trio.Nursery, ev.StartProviderTurn], Awaitable[None]]
    _steer: Callable[[ev.SteerProviderTurn], Awaitable[None]]
    _interrupt: Callable[[trio.Nursery, ev.InterruptProviderTurn], Awaitable[None]]
    _answer: Callable[[ev.AnswerProviderRequest], Awaitable[None]]
    _items: ItemCoalescer
    _held: dict[str, TurnItem]
    # The process last stopped for being idle: forgotten by the session (the next turn
    # starts a new one) while its reader, in the session's nursery, records its exit.
    _idle_stopped: ClaudeProcess | None = None

    async def _serve_inbox(
        self, nursery: trio.Nursery, inbox: trio.MemoryReceiveChannel[ev.Effect], reattach: Reattach | None
    ) -> None:
        """Take over ``reattach``'s agent, then handle the effects in order until a
        `StopProviderSession` or the end of the inbox."""
        if reattach is not None:
            await self._reattach(nursery, reattach)
        async for effect in inbox:
            if isinstance(effect, ev.StartProviderTurn):
                await self._start_turn(nursery, effect)
            elif isinstance(effect, ev.SteerProviderTurn):
                await self._steer(effect)
            elif isinstance(effect, ev.InterruptProviderTurn):
                await self._interrupt(nursery, effect)
            elif isinstance(effect, ev.AnswerProviderRequest):
                await self._answer(effect)
            elif isinstance(effect, ev.StopProviderSession):
                return

    async def _stop_idle(self, proc: ClaudeProcess) -> None:
        """Stop ``proc``, which the caller has just forgotten for being idle; its exit ends
        no turn, and the session's end waits for it (`_settle_idle_stop`)."""
        proc.detached = True
        self._idle_stopped = proc
        await proc.stop()

    async def _settle_idle_stop(self) -> None:
        """The session is ending: let a process stopped for being idle record its exit first
        (cancelling its reader would leave its row `running` for ever). Bounded."""
        proc = self._idle_stopped
        if proc is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(EXIT_RECORD_S):
                await proc.exit_handled.wait()

    async def _item_changed(self, turn_id: str, item: TurnItem, *, final: bool, replaying: bool) -> None:
        """Record an item's new state: held while a replay runs (written once it is through,
        or before its next barrier), committed at once when final, else streamed through the
        coalescer."""
        if replaying:
            self._held[item.id] = item
        elif final:
            self._items.forget((item.id,))
            await self._commit(c.RecordItems(turn_id, (item,)))
        else:
            await self._items.stream(item)

    async def _record_session(
        self,
        proc: ClaudeProcess,
        *,
        status: str,
        exit_code: int | None = None,
        stderr_tail: str | None = None,
    ) -> None:
        """Commit the process's `ProviderSession` row: running, or exited with its status."""
        now = self._clock()
        session = ProviderSession(
            id=proc.session_id,
            thread_id=self.spec.thread_id,
            provider=self.spec.provider,
            status=status,  # type: ignore[arg-type]
            started_at=proc.started_at,
            native_session_id=self._resume,
            pid=proc.process.pid,
            exited_at=now if status == "exited" else None,
            exit_code=exit_code,
            stderr_tail=stderr_tail,
        )
        await self._commit(c.RecordSession(session))

    # --- commits ---------------------------------------------------------------------------

    async def _commit(self, command: c.Command) -> None:
        """Write after every pending streaming update (`ItemCoalescer.commit`)."""
        await self._items.commit(functools.partial(self._write, command))

    async def _commit_checked(self, command: c.Command) -> bool:
        """`_commit`, and whether the domain took it (False: refused, e.g. archived)."""
        taken: list[object] = []

        async def write() -> None:
            taken.append(await self._write(command))

        await self._items.commit(write)
        return taken[0] is not False

    async def _record_items(self, turn_id: str, items: tuple[TurnItem, ...]) -> None:
        """The coalescer's streaming states of one turn (a turn's own, or a subagent's)."""
        await self._write(c.RecordItems(turn_id, items))
