"""`CommitTally`: counts and log lines from committed events. Pure: no trio, no I/O but logging.

A `store.on_commit` listener (it runs on the loop after every COMMIT, so it must be cheap:
a dictionary update per event, a little more per turn or session change; measured by
``python -m bench.observe_cost``: ~0.3 µs per event of a provider's stream, ~1.2 µs with
the turn and agent log lines written). From the events it keeps:

- events committed, by kind;
- turns started (first seen ``running`` or ``waiting``) by provider, and finished (a
  terminal status) by provider and outcome; the duration of each finished turn that had
  started (``completed_at - started_at``, the turn's own times) in a histogram;
- the active turn of each thread (``starting``, ``running``, ``waiting``), and each thread's
  live agent (from ``session.updated``), for `ctl top` and the agents metric;
- each thread's provider (from ``thread.updated`` and ``session.updated``).

It logs one line when a turn starts and when it ends (thread, turn, provider, outcome,
duration, error) and when an agent starts and exits (pid, exit status), each with the
same facts as structured fields (``--log-format json`` prints them).

Only what this daemon committed is seen: turns closed by restart recovery (before the
listener is registered) are not counted, and a turn that was already running when the
daemon started is counted as started when it is first seen running.

Bounded: active turns and agents are at most one per thread, and are dropped when the
turn ends, the agent exits or the thread is deleted; the provider map holds at most
`MAX_THREADS` threads (the least recently updated are forgotten first; a turn of a
forgotten thread is counted under provider ``unknown``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import attrs

from t3d.domain.model import ProviderSession, Thread, Turn
from t3d.observe.histogram import Histograms

if TYPE_CHECKING:  # the store's module imports apsw; this one stays pure
    from t3d.store.commit import Committed

turns_log = logging.getLogger("t3d.turns")
agents_log = logging.getLogger("t3d.agents")

MAX_THREADS = 10_000
UNKNOWN = "unknown"
TURN_SECONDS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
# Longest error text copied into a log line (the turn keeps all of it).
MAX_LOGGED_ERROR = 500


@attrs.define
class ActiveTurn:
    turn_id: str
    ordinal: int
    status: str
    requested_at: float
    started_at: float | None = None
    counted: bool = False  # counted as started


@attrs.define
class Agent:
    session_id: str
    provider: str
    pid: int | None
    started_at: float


class CommitTally:
    def __init__(self) -> None:
        self.events: dict[str, int] = {}
        self.turns_started: dict[str, int] = {}  # provider -> count
        self.turns_finished: dict[tuple[str, str], int] = {}  # (provider, outcome) -> count
        self.turn_seconds = Histograms(TURN_SECONDS, max_series=64)
        self.active: dict[str, ActiveTurn] = {}  # thread id -> its active turn
        self.agents: dict[str, Agent] = {}  # thread id -> its live agent (per session.updated)
        self._providers: OrderedDict[str, str] = OrderedDict()

    def provider(self, thread_id: str) -> str:
        return self._providers.get(thread_id, UNKNOWN)

    def on_commit(self, committed: Committed) -> None:
        events = self.events
        for event in committed.events:
            kind = event.kind
            events[kind] = events.get(kind, 0) + 1
            if kind == "item.updated":
                continue  # the bulk of events: nothing more to do
            entity = event.entity
            if kind == "turn.updated" and isinstance(entity, Turn):
                self._turn(entity)
            elif kind == "thread.updated" and isinstance(entity, Thread):
                self._remember(entity.id, entity.provider)
            elif kind == "session.updated" and isinstance(entity, ProviderSession):
                self._remember(entity.thread_id, entity.provider)
                self._session(entity)
            elif kind == "thread.deleted" and isinstance(entity, Thread):
                self._providers.pop(entity.id, None)
                self.active.pop(entity.id, None)
                self.agents.pop(entity.id, None)

    def _remember(self, thread_id: str, provider: str) -> None:
        providers = self._providers
        if providers.get(thread_id) == provider:
            providers.move_to_end(thread_id)
            return
        providers[thread_id] = provider
        providers.move_to_end(thread_id)
        if len(providers) > MAX_THREADS:
            providers.popitem(last=False)

    # --- turns ----------------------------------------------------------------------------

    def _turn(self, turn: Turn) -> None:
        thread_id = turn.thread_id
        active = self.active.get(thread_id)
        if active is not None and active.turn_id != turn.id:
            active = None  # another turn of the thread: the old one's end was seen, or never will be
        if turn.status in ("starting", "running", "waiting"):
            if active is None:
                active = self.active[thread_id] = ActiveTurn(turn.id, turn.ordinal, turn.status, turn.requested_at)
            active.status, active.started_at = turn.status, turn.started_at
            if turn.started_at is not None and not active.counted:
                active.counted = True
                provider = self.provider(thread_id)
                self.turns_started[provider] = self.turns_started.get(provider, 0) + 1
                turns_log.info(
                    "thread %s: turn %d (%s) started on %s",
                    thread_id, turn.ordinal, turn.id, provider,
                    extra={"event": "turn_started", "thread_id": thread_id, "turn_id": turn.id,
                           "ordinal": turn.ordinal, "provider": provider},
                )  # fmt: skip
            return
        if active is not None:
            del self.active[thread_id]
        if turn.completed_at is not None and turn.status in ("completed", "interrupted", "failed", "cancelled"):
            self._finished(turn)

    def _finished(self, turn: Turn) -> None:
        provider, outcome = self.provider(turn.thread_id), turn.status
        key = (provider, outcome)
        self.turns_finished[key] = self.turns_finished.get(key, 0) + 1
        assert turn.completed_at is not None
        duration = None if turn.started_at is None else max(0.0, turn.completed_at - turn.started_at)
        if duration is not None:
            self.turn_seconds.observe(key, duration)
        error = turn.error if turn.error is None or len(turn.error) <= MAX_LOGGED_ERROR else turn.error[:MAX_LOGGED_ERROR] + "…"
        if duration is not None:
            how = f"after {duration:.1f} s"
        else:
            how = f"before it started ({max(0.0, turn.completed_at - turn.requested_at):.1f} s after it was requested)"
        turns_log.log(
            logging.WARNING if outcome == "failed" else logging.INFO,
            "thread %s: turn %d (%s) %s %s on %s%s",
            turn.thread_id, turn.ordinal, turn.id, outcome, how, provider, f": {error}" if error else "",
            extra={"event": "turn_finished", "thread_id": turn.thread_id, "turn_id": turn.id,
                   "ordinal": turn.ordinal, "provider": provider, "outcome": outcome,
                   "duration_s": None if duration is None else round(duration, 3),
                   "error": error, "reason": turn.reason},
        )  # fmt: skip

    # --- agents ---------------------------------------------------------------------------

    def _session(self, session: ProviderSession) -> None:
        thread_id = session.thread_id
        known = self.agents.get(thread_id)
        if session.status == "exited":
            if known is not None and known.session_id == session.id:
                del self.agents[thread_id]
            ran = None if session.exited_at is None else max(0.0, session.exited_at - session.started_at)
            tail = (session.stderr_tail or "").strip().splitlines()
            last = tail[-1][:MAX_LOGGED_ERROR] if tail and session.exit_code else None
            agents_log.info(
                "thread %s: %s agent (pid %s) exited with status %s%s%s",
                thread_id, session.provider, session.pid, session.exit_code,
                "" if ran is None else f" after {ran:.1f} s", f": {last}" if last else "",
                extra={"event": "agent_exited", "thread_id": thread_id, "provider": session.provider,
                       "pid": session.pid, "session_id": session.id, "exit_code": session.exit_code,
                       "ran_s": None if ran is None else round(ran, 3), "stderr_last_line": last},
            )  # fmt: skip
            return
        if known is not None and known.session_id == session.id:
            known.pid = session.pid
            return
        self.agents[thread_id] = Agent(session.id, session.provider, session.pid, session.started_at)
        agents_log.info(
            "thread %s: %s agent started (pid %s)",
            thread_id, session.provider, session.pid,
            extra={"event": "agent_started", "thread_id": thread_id, "provider": session.provider,
                   "pid": session.pid, "session_id": session.id},
        )  # fmt: skip

    # --- views ----------------------------------------------------------------------------

    def active_by_status(self) -> dict[str, int]:
        counts = {"starting": 0, "running": 0, "waiting": 0}
        for turn in self.active.values():
            counts[turn.status] = counts.get(turn.status, 0) + 1
        return counts

    def describe_thread(self, thread_id: str) -> dict[str, Any]:
        """What `server.agents` says of a thread's turn and agent, from the events seen."""
        turn, agent = self.active.get(thread_id), self.agents.get(thread_id)
        return {
            "provider": agent.provider if agent is not None else self.provider(thread_id),
            "status": "idle" if turn is None else turn.status,
            "turn_id": None if turn is None else turn.turn_id,
            "turn_ordinal": None if turn is None else turn.ordinal,
            "turn_started_at": None if turn is None else turn.started_at,
            "turn_requested_at": None if turn is None else turn.requested_at,
            "agent_started_at": None if agent is None else agent.started_at,
            "session_id": None if agent is None else agent.session_id,
        }
