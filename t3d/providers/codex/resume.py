"""Taking over a ``codex app-server`` a previous daemon left running (`Reattach`): the part
of `CodexSession` that runs once, before the session reads its inbox.

What the new session needs is rebuilt, never asked of Codex again: the handshake is
done and the Codex thread is the meta's ``native_session_id``; JSON-RPC ids count on
from the meta's ``next_request_id`` and from every id a replayed response shows; the
open turn, its items and the server requests still waiting for an answer come from
replaying the turn's output through a fresh `TurnMapper`.

Rules:
- The open turn is the one the process was last given (its turn/start was written or
  about to be): replay its output from the turn's offset, item states held until the
  replay is through (one write per item, in first-seen order, so no client sees an item
  go back to an older state), barriers (a prompt, the turn's end) written in place. Its
  turn/start is not sent again; the answer to it, in the replay or live, marks the turn
  running (or fails it, as a refusal); with neither an answer nor any event of the turn
  within `CALL_TIMEOUT_S`, the turn fails as it would have without the restart.
- Approvals: pending ones are known from the database, whatever the replay shows; the
  replay gives the exact requests, and `serverRequest/resolved` drops the ones Codex no
  longer waits on. An answer the database has for a request Codex still waits on (the
  previous daemon died before Codex read it) is sent again. Requests answered without a
  user (refusals) are answered after the replay unless it shows them resolved.
- An interrupt asked for, or a turn the daemon gave up on, is sent once the replay is
  through (and escalates as usual).
- A replay that lost the turn's start reads on from the live point, from the committed
  items (the agents its spawn items name are its children again), with an error item in
  the turn saying what was lost.
- The open turn is another one, or none: nothing is replayed; another one is started as
  usual on the process. A process whose handshake had not finished is of no use: it is
  stopped and the turn starts on a new process.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import trio

from t3d.domain import events as ev
from t3d.domain.model import RuntimeRequest
from t3d.providers.claude.process import ClaudeProcess as CliProcess
from t3d.providers.codex import events as ce
from t3d.providers.codex.adapter import TurnEnded, TurnMapper
from t3d.providers.codex.peer import CALL_TIMEOUT_S, CodexPeer
from t3d.providers.codex.protocol import approval_kind
from t3d.providers.codex.turns import TurnDriver
from t3d.providers.reattach import Reattach

log = logging.getLogger("t3d.providers.codex")


class ResumeAfterRestart(TurnDriver):
    """The takeover of `CodexSession` (state is set up by its ``__init__``)."""

    async def _reattach(self, nursery: trio.Nursery, reattach: Reattach) -> None:
        """Take over the process a previous daemon left; replay its open turn's output."""
        child, meta = reattach.child, reattach.meta
        started_at = meta.get("started_at")
        proc = CliProcess(
            child,
            str(meta.get("session_id") or uuid.uuid4().hex),
            float(started_at) if isinstance(started_at, int | float) else self._clock(),
        )
        turn = reattach.turn
        codex_thread = meta.get("native_session_id")
        if not isinstance(codex_thread, str) or not codex_thread:
            await self._replace_unready(nursery, proc, reattach)
            return
        peer = CodexPeer(proc, self.spec.provider, self._notes, next_id=_whole(meta.get("next_request_id")) or 1)
        peer.thread_id, peer.ready = codex_thread, True
        self._peer, self._resume = peer, codex_thread
        self._usage_total = _usage(meta.get("usage_total"))
        done = meta.get("done_turns")
        if isinstance(done, list):  # their late notifications are not this turn's
            self._done_turns.extend(t for t in done if isinstance(t, str))
        proc.turn_id, proc.turn_offset = meta.get("turn_id"), reattach.turn_offset
        if turn is not None and reattach.same_turn:
            self._resume_turn(reattach, peer)
        else:  # between turns, or the open turn never reached the process: skip the replay
            proc.skip_until = child.replay.end
        log.info(
            "%s: reattached to its %s process (pid %d), %d bytes to replay%s",
            self._tag, self.spec.provider, child.pid, child.replay.end - child.replay.start,
            "" if turn is None else f", turn {turn.id} {turn.status}",
        )
        nursery.start_soon(proc.read_stderr)
        nursery.start_soon(self._read_stdout, peer)
        await proc.output.replayed.wait()
        await self._flush_held()
        deferred, self._deferred = self._deferred, {}
        for line in deferred.values():
            await peer.send_quietly(line)
        self._idle_since = trio.current_time()
        if turn is None:
            return
        if not reattach.same_turn:
            await self._start_turn(nursery, ev.StartProviderTurn(self.spec.thread_id, turn.id, reattach.user_text, turn.ordinal))
            return
        mapper = self._turn
        if mapper is None or mapper.turn_id != turn.id or self._peer is not peer:
            return  # the replay ended it (or the process is gone)
        await self._resend_answers(reattach)
        if peer.turn_request_id is not None:  # turn/start's answer is not in the replay
            nursery.start_soon(self._await_turn_start, mapper, peer)
        if mapper.fail_with is not None:  # given up on in the replay (a line too long)
            await self._stop_turn(mapper)
        elif mapper.interrupt_requested:  # (unless Codex has not named the turn yet: then it escalates)
            await self._send_interrupt(mapper)
        if mapper.fail_with is not None or mapper.interrupt_requested:
            nursery.start_soon(self._escalate_interrupt, mapper, peer)

    def _resume_turn(self, reattach: Reattach, peer: CodexPeer) -> None:
        turn = reattach.turn
        assert turn is not None
        proc = peer.proc
        mapper = TurnMapper(self.spec.thread_id, turn.id, self._clock, self._usage_total)
        mapper.interrupt_requested = turn.interrupt_requested_at is not None
        self._turn = mapper
        self._known_turns.append(turn.id)
        self._quiet_since = trio.current_time()
        peer.turn_request_id = _whole(reattach.meta.get("turn_request_id"))
        for request in reattach.requests:  # so an answer reaches Codex whatever the replay shows
            # (the turn's own and its spawned agents': ``<its turn id>:<Codex's request id>``)
            approval = _approval_of(request, f"{request.turn_id}:", peer.thread_id or "")
            if request.status == "pending" and approval is not None:
                self._requests[request.id] = approval
        if reattach.complete:
            proc.skip_until = reattach.turn_offset
            return
        # The turn's start is gone from the replay: read on from the live point.
        proc.skip_until = reattach.child.replay.end
        mapper.restore(reattach.items)
        self._collab.restore(mapper, reattach.items)  # its spawned agents read on live too
        log.warning(
            "%s: turn %s: %d bytes of its output from before the restart were dropped "
            "(over the spawner's replay buffer); reading on from the live point",
            self._tag, turn.id, reattach.lost_bytes,
        )
        gap = reattach.gap_item(self.spec.provider, self._clock)
        self._held[gap.id] = gap

    async def _resend_answers(self, reattach: Reattach) -> None:
        """Answers the database has but Codex may never have read (the daemon died first):
        sent again when the replay shows Codex still waiting."""
        if not reattach.complete:
            return
        for request in reattach.requests:
            if request.status != "resolved" or request.decision is None or request.id not in self._requests:
                continue
            log.info("%s: answering request %s again after the restart", self._tag, request.id)
            await self._answer(ev.AnswerProviderRequest(self.spec.thread_id, request.id, request.decision, request.message))

    async def _await_turn_start(self, turn: TurnMapper, peer: CodexPeer) -> None:
        """The previous daemon's turn/start had no answer yet: give it the bound it had."""
        await trio.sleep(CALL_TIMEOUT_S)
        if self._turn is turn and peer.turn_request_id is not None and turn.codex_turn_id is None:
            error = f"did not answer turn/start within {CALL_TIMEOUT_S:g} s; start a new turn to restart it"
            await self._end_turn(TurnEnded("failed", f"{self.spec.provider} {error}", "provider_start_failed", None), turn)

    async def _replace_unready(self, nursery: trio.Nursery, proc: CliProcess, reattach: Reattach) -> None:
        """The previous daemon left the process before its handshake was through: stop it;
        the open turn starts on a new process (which resumes the Codex thread)."""
        log.warning(
            "%s: its %s process (pid %d) was left before its handshake finished; starting a new one",
            self._tag, self.spec.provider, proc.process.pid,
        )
        await proc.stop()
        code = proc.process.returncode
        await self._record_session(proc, status="exited", exit_code=code)
        turn = reattach.turn
        if turn is not None:
            await self._start_turn(nursery, ev.StartProviderTurn(self.spec.thread_id, turn.id, reattach.user_text, turn.ordinal))


def _approval_of(request: RuntimeRequest, prefix: str, thread_id: str) -> ce.ApprovalRequested | None:
    """The Codex request a committed approval answers (what answering it needs), rebuilt from
    its record: ``<turn id>:<Codex's request id>`` and the data `TurnMapper` gave it."""
    if not request.id.startswith(prefix):
        return None
    data = request.data or {}
    method = data.get("method")
    kind = approval_kind(method) if isinstance(method, str) else None
    if kind is None or not isinstance(method, str):
        return None
    raw_id = request.id[len(prefix) :]
    codex_id: ce.RequestId = int(raw_id) if raw_id.isdigit() else raw_id  # Codex counts from 0
    given = data.get("input")
    tool_input: dict[str, Any] = given if isinstance(given, dict) else {}
    available = data.get("available_decisions")
    return ce.ApprovalRequested(
        id=codex_id,
        method=method,
        kind=kind[0],
        legacy=kind[1],
        thread_id=thread_id,
        turn_id="",
        item_id=str(data.get("tool_use_id") or ""),
        command=tool_input.get("command") if isinstance(tool_input.get("command"), str) else None,
        cwd=tool_input.get("cwd") if isinstance(tool_input.get("cwd"), str) else None,
        reason=None,
        available=tuple(d for d in available if isinstance(d, str)) if isinstance(available, list) else None,
        params={"permissions": tool_input.get("permissions")} if kind[0] == "permissions" else {},
    )


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(value: Any) -> ce.Usage | None:
    """Codex's token total as the meta keeps it (`attrs.astuple` of a `Usage`)."""
    if not isinstance(value, list) or len(value) != 5 or not all(_whole(v) is not None for v in value):
        return None
    return ce.Usage(*value)
