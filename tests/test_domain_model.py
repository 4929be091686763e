"""Stateful models of the domain: any command sequence keeps the rules.

Two machines drive the same random command sequences:
- `DomainMachine` runs pure `decide` against the in-memory `State` and
  checks the domain's invariants after every step;
- `StoreMachine` runs the real transaction code (`commit.execute`) on a real
  SQLite file and checks that the projection tables always equal the fold of
  the event log, and that retried command ids replay their first outcome.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apsw
import attrs
import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from t3d.domain import commands as c
from t3d.domain.codec import event_from, to_json
from t3d.domain.decide import decide
from t3d.domain.model import ACTIVE_TURN_STATUSES, MAX_PENDING_REQUESTS, TurnItem
from t3d.domain.state import State, fold
from t3d.errors import DomainError
from t3d.store.commit import execute
from t3d.store.schema import WRITER_PRAGMAS, migrate

TEXT = st.text(min_size=0, max_size=12)
PROMPT = st.text(alphabet="ab ", min_size=0, max_size=4).map(lambda t: t or "go")
TURN_IDS = itertools.count()


SEL = st.integers(0, 5)
TURN_RULES_WEIGHT = 3


def _pick(known: dict[str, Any], prefix: str, sel: int) -> str:
    """Mostly an id that exists (selectors 0-4), sometimes a fresh or unknown one."""
    ids = sorted(known)
    if ids and sel < 5:
        return ids[sel % len(ids)]
    return f"{prefix}-{'abc'[sel % 3]}"


def _command(op: Callable[..., c.Command], *picks: tuple[str, str]) -> Callable[..., Any]:
    """A strategy of ``state -> command`` closures: the strategy is built once, ids are picked late."""

    def build(sels: list[int], *rest: Any) -> Callable[[State], c.Command]:
        def make(state: State) -> c.Command:
            ids = [_pick(getattr(state, table, {}), prefix, sel) for (table, prefix), sel in zip(picks, sels, strict=True)]
            return op(*ids, *rest)

        return make

    return build


ITEM = st.builds(
    lambda key, kind, status, text: TurnItem(
        id=f"i-{key}", thread_id="", turn_id="", ordinal=0, kind=kind, status=status,
        title=None, text=text, data=None, updated_at=0.0,
    ),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["assistant_message", "tool_call", "reasoning"]),
    st.sampled_from(["streaming", "completed", "running"]),
    TEXT,
)
P, T, U, R = ("projects", "p"), ("threads", "t"), ("turns", "u"), ("requests", "r")


def _sels(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(SEL, min_size=n, max_size=n)


# A uniform pick of the command kind (st.one_of would favour the first alternatives),
# with turn commands weighted up so short runs reach queueing, requests and recovery.
TURN_COMMANDS = [
    st.builds(_command(lambda t, text: c.StartTurn(t, f"u-{next(TURN_IDS)}", text), T), _sels(1), PROMPT),
    st.builds(_command(c.FinishTurn, U), _sels(1), st.sampled_from(["completed", "failed", "interrupted", "cancelled", "running"])),
    st.builds(_command(c.MarkTurnRunning, U), _sels(1)),
    st.builds(_command(lambda t, items: c.RecordItems(t, tuple(items)), U), _sels(1), st.lists(ITEM, max_size=3)),
    st.builds(
        _command(lambda t, key: c.OpenRequest(t, f"r-{key}", "permission", attrs.evolve(_approval, id=f"i-req-{key}")), U),
        _sels(1),
        st.sampled_from(["a", "b", "c"]),
    ),
    st.builds(_command(c.RespondToRequest, R), _sels(1), st.sampled_from(["allow", "deny", "cancel", "maybe"])),
    st.builds(_command(c.InterruptTurn, T), _sels(1)),
    st.builds(_command(c.HoldTurn, U), _sels(1), st.sampled_from(["loop_saturated", "max_active_turns", "bogus"])),
    st.builds(_command(c.AdmitTurn, U), _sels(1)),
    st.just(lambda state: c.RecoverAfterRestart()),
    # Steering, queue edits, turns the provider starts, background tasks.
    st.builds(_command(lambda t, text: c.StartTurn(t, f"u-{next(TURN_IDS)}", text, "steer"), T), _sels(1), PROMPT),
    st.builds(_command(c.EditTurn, U), _sels(1), PROMPT),
    st.builds(_command(c.MoveTurn, U, U), _sels(2)),
    st.builds(_command(lambda u: c.MoveTurn(u, None), U), _sels(1)),
    st.builds(_command(c.CancelTurn, U), _sels(1)),
    st.builds(
        _command(lambda t, throttled: c.OpenProviderTurn(t, f"u-w{next(TURN_IDS)}", {"kind": "unknown"}, throttled), T),
        _sels(1),
        st.booleans(),
    ),
    st.builds(_command(c.ReleaseProviderTurn, U), _sels(1)),
    # A subagent of an open turn (the parent may be a subagent's turn: they nest).
    st.builds(
        _command(lambda u, key: c.OpenSubagent(u, f"toolu-{key}", f"t-sub-{u}-{key}", f"u-sub-{u}-{key}", "general-purpose", "look", "look"), U),
        _sels(1),
        st.sampled_from(["a", "b"]),
    ),
    st.builds(
        _command(lambda t, u, key, status: c.RecordTasks(t, (_task(u, key, status),)), T, U),
        _sels(2),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["running", "completed", "stopped"]),
    ),
    st.builds(
        _command(lambda t, u, text: c.RequeueSteer(t, f"{u}:steer:x", f"u-s{next(TURN_IDS)}", text), T, U), _sels(2), PROMPT
    ),
]
SETUP_COMMANDS = [
    st.builds(_command(c.CreateThread, T, P), _sels(2), st.sampled_from(["replay", "replay", "claude", "codex"])),
    st.builds(_command(c.RenameThread, T), _sels(1), TEXT),
    st.builds(_command(c.CreateProject, P), _sels(1), st.sampled_from(["/w/a", "/w/b", "relative"])),
    st.builds(_command(c.ArchiveThread, T), _sels(1)),
    st.builds(_command(c.UnarchiveThread, T), _sels(1)),
    st.builds(_command(c.DeleteThread, T), _sels(1)),
]
COMMANDS: st.SearchStrategy[Callable[[State], c.Command]] = st.sampled_from(
    TURN_COMMANDS * TURN_RULES_WEIGHT + SETUP_COMMANDS
).flatmap(lambda kind: kind)


# Every run starts from a project with two threads, so short sequences reach turn rules.
SETUP = (
    c.CreateProject("p-a", "/w/a"),
    c.CreateThread("t-a", "p-a", "replay"),
    c.CreateThread("t-b", "p-a", "claude"),
)

def _task(turn_id: str, key: str, status: str) -> TurnItem:
    return TurnItem(
        id=f"{turn_id}:task:{key}", thread_id="", turn_id=turn_id, ordinal=0, kind="background_task",
        status=status, title="sleep", text=None, data={"task_id": key}, updated_at=0.0,  # type: ignore[arg-type]
    )


_approval = TurnItem(
    id="", thread_id="", turn_id="", ordinal=0, kind="approval_request", status="pending",
    title="Edit", text=None, data={"input": {}}, updated_at=0.0,
)


def check_invariants(state: State) -> None:
    for thread in state.threads.values():
        open_turns = state.open_turns(thread.id)
        active = [t for t in open_turns if t.status in ACTIVE_TURN_STATUSES]
        held = [t for t in open_turns if t.held]
        assert len(active) + len(held) <= 1, "a thread runs (or holds) at most one turn at a time"
        busy = active or held
        expected = "waiting" if any(t.status == "waiting" for t in active) else "running" if active else "queued" if held else "idle"
        assert thread.status == expected, "thread status is derived from its turns"
        assert thread.queue_reason == (held[0].queue_reason if held else None), "a queued thread says why"
        if open_turns:
            assert busy and open_turns[0] is busy[0], "a queued turn waits only behind an active or held one"
        ordinals = sorted(t.ordinal for t in state.turns.values() if t.thread_id == thread.id)
        assert ordinals == list(range(1, len(ordinals) + 1)), "turn ordinals are dense"
    for turn in state.turns.values():
        assert turn.thread_id in state.threads, "no turn outlives its thread"
        if turn.terminal:
            assert turn.completed_at is not None, "a terminal turn records when it ended"
    for request in state.requests.values():
        if request.status == "pending":
            assert state.turns[request.turn_id].status == "waiting", "a pending request holds its turn waiting"
    for turn in state.turns.values():
        assert len(state.pending_requests(turn.id)) <= MAX_PENDING_REQUESTS, "a turn's pending requests are bounded"
    for thread in state.threads.values():
        running = {i.id for i in state.items.values() if i.kind == "background_task" and i.status == "running" and i.thread_id == thread.id}
        assert set(thread.running_tasks) <= running, "a thread lists only its tasks still running"
        assert len(thread.running_tasks) == len(set(thread.running_tasks)), "each task once"
    for thread in state.threads.values():
        if thread.subagent is None:
            continue
        assert thread.parent_thread_id in state.threads, "a subagent goes with its parent"
        parent_turn = state.turns[thread.subagent["parent_turn_id"]]
        own = state.turns.get(f"u-sub-{parent_turn.id}-{thread.subagent['tool_use_id'].removeprefix('toolu-')}")
        if own is not None and not own.terminal:
            assert not parent_turn.terminal, "a subagent's turn ends with its parent's turn"
    for turn_id in {i.turn_id for i in state.items.values()}:
        ordinals = sorted(i.ordinal for i in state.items.values() if i.turn_id == turn_id)
        assert ordinals == list(range(1, len(ordinals) + 1)), "item ordinals are dense per turn"


class DomainMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = State()
        self.log: list[Any] = []
        self.clock = itertools.count(1)

    @initialize()
    def a_project_and_two_threads(self) -> None:
        for command in SETUP:
            self.run(lambda state, command=command: command)

    @rule(make=COMMANDS)
    def run(self, make: Callable[[State], c.Command]) -> None:
        command = make(self.state)
        try:
            decision = decide(self.state, command, float(next(self.clock)))
        except DomainError as exc:
            assert exc.code in ("not_found", "conflict", "invalid", "full")
            return
        for event in decision.events:
            self.state.apply(event)
        self.log += decision.events

    @invariant()
    def rules_hold(self) -> None:
        check_invariants(self.state)
        assert fold(self.log) == self.state


TestDomainMachine = DomainMachine.TestCase
TestDomainMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


PROJECTION_TABLES = ("projects", "threads", "turns", "items", "requests", "sessions")


class StoreMachine(RuleBasedStateMachine):
    command_ids = Bundle("command_ids")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.conn = apsw.Connection(str(Path(self.dir.name) / "t.sqlite"))
        for pragma in WRITER_PRAGMAS:
            self.conn.execute(pragma)
        migrate(self.conn)
        self.clock = itertools.count(1)
        self.outcomes: dict[str, Any] = {}

    def teardown(self) -> None:
        self.conn.close()
        self.dir.cleanup()

    def _execute(self, command: c.Command, command_id: str | None) -> Any:
        try:
            return execute(self.conn, command, command_id, float(next(self.clock))).result
        except DomainError as exc:
            return ("rejected", exc.code, exc.message)

    @initialize()
    def a_project_and_two_threads(self) -> None:
        for command in SETUP:
            self._execute(command, None)

    @rule(target=command_ids, make=COMMANDS, n=st.integers(0, 10**9))
    def run(self, make: Callable[[State], c.Command], n: int) -> str:
        command = make(self._fold())
        command_id = f"cmd-{n}"
        if command_id in self.outcomes:
            return command_id
        self.outcomes[command_id] = (command, self._execute(command, command_id))
        return command_id

    @rule(command_id=command_ids)
    def retry(self, command_id: str) -> None:
        command, first = self.outcomes[command_id]
        assert self._execute(command, command_id) == first, "a retried command_id replays its first outcome"

    def _fold(self) -> State:
        return fold(event_from(k, p) for k, p in self.conn.execute("SELECT kind, payload FROM events ORDER BY sequence"))

    @invariant()
    def projections_equal_fold_of_log(self) -> None:
        expected = self._fold()
        for table in PROJECTION_TABLES:
            rows = {orjson.loads(body)["id"]: orjson.loads(body) for (body,) in self.conn.execute(f"SELECT body FROM {table}")}
            folded = {e.id: to_json(e) for e in getattr(expected, table).values()}
            assert rows == folded, f"{table} equals the fold of the event log"
        counts = {t: (n, i) for t, n, i in self.conn.execute("SELECT thread_id, turns, items FROM thread_counts")}
        for thread_id in expected.threads:
            turns = sum(1 for t in expected.turns.values() if t.thread_id == thread_id)
            items = sum(1 for i in expected.items.values() if i.thread_id == thread_id)
            assert counts.get(thread_id, (0, 0)) == (turns, items), "maintained counts match the rows"
        check_invariants(expected)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def test_a_turn_opens_at_most_the_bound_of_pending_requests() -> None:
    """A turn with MAX_PENDING_REQUESTS pending requests refuses the next one (code
    ``full``, naming the bound and the fix) and records nothing for it; once one is
    answered, a new one opens again."""
    state, clock = State(), itertools.count(1)

    def run(command: c.Command) -> None:
        for event in decide(state, command, float(next(clock))).events:
            state.apply(event)

    def ask(key: int) -> c.OpenRequest:
        return c.OpenRequest("u-1", f"r-{key}", "permission", attrs.evolve(_approval, id=f"i-req-{key}"))

    for command in (*SETUP, c.StartTurn("t-a", "u-1", "go")):
        run(command)
    for key in range(MAX_PENDING_REQUESTS):
        run(ask(key))
    before = (dict(state.requests), dict(state.items))
    try:
        decide(state, ask(MAX_PENDING_REQUESTS), 100.0)
    except DomainError as exc:
        assert exc.code == "full"
        assert f"already has {MAX_PENDING_REQUESTS} prompts waiting for an answer" in exc.message
        assert "requests.pending" in exc.message
    else:
        raise AssertionError("the request over the bound was opened")
    assert (dict(state.requests), dict(state.items)) == before
    run(c.RespondToRequest("r-0", "allow", None))
    run(ask(MAX_PENDING_REQUESTS))
    assert len(state.pending_requests("u-1")) == MAX_PENDING_REQUESTS
