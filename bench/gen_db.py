"""A synthetic database shaped like a busy host's, for tests and ``python -m bench run --db``.

    python -m bench gen-db --events 1000000 --out /tmp/t3d-1m.sqlite

It is written with the daemon's own schema (`migrate`), its own event encoding
(`event_payload`) and its own projection upserts (`apply_event`), so ``t3d serve`` opens
it as a database it wrote itself. Unlike the benchmark run, this command imports t3d.

Shape (seed 000's host: 2,700 threads, one thread of 86,755 items, a 10 GB file):
- thousands of threads over a few dozen projects; how much each thread did is skewed
  (a Pareto weight), a tenth are subagents (child threads) of another thread;
- one thread of ``big_items`` items (200 per turn), interleaved in time with the rest;
- turns stream items: reasoning and assistant text as growing snapshots, tool calls
  and commands as running then completed (a few with 20-60 KiB of output), a
  permission prompt in one turn of six; every item snapshot is one event, as on a
  host before retention prunes them;
- a few threads end with a turn still running or waiting on a request, and a live
  session, so start-up recovery has work to do as after a crash.

Fast: one connection, no journal while generating, rows inserted with ``executemany``
in transactions of about `FLUSH_EVENTS` events; the file is written beside ``out`` and
renamed into place when whole, then switched to WAL as the daemon keeps it.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import apsw
import attrs

FLUSH_EVENTS = 100_000
ITEMS_PER_BIG_TURN = 200
START = 1_760_000_000.0  # the first event's time; later ones follow it

_TEXT = (
    "the function returns a value when its input is valid otherwise it raises an error "
    "so the caller can retry with a smaller batch of rows read from the index we keep "
    "beside each table because a scan of millions of events would block every reader "
    "def main args config path open read write commit rollback async await trio nursery"
)


MIN_THREADS = 21  # so that the shape has a subagent thread


@attrs.frozen
class Shape:
    events: int
    threads: int
    big_items: int
    projects: int
    seed: int = 1

    @classmethod
    def for_events(
        cls, events: int, *, threads: int | None = None, big_items: int | None = None, seed: int = 1
    ) -> Shape:
        """A busy host's proportions at ``events`` events: 2,700 threads from 1 M events on,
        fewer below; the big thread holds about a quarter of the events, up to 100k items."""
        if events < 200:
            raise ValueError(f"--events {events} is too few for the shape; use at least 200")
        if threads is not None and threads < MIN_THREADS:
            raise ValueError(f"--threads {threads} is too few: the shape needs {MIN_THREADS} (every tenth thread from the 21st on is a subagent)")
        threads = threads or max(MIN_THREADS, min(2700, events // 370))
        big_items = big_items if big_items is not None else min(100_000, events // 10)
        return cls(events, threads, big_items, max(1, min(40, threads // 60)), seed)


@attrs.frozen
class Generated:
    path: Path
    events: int
    threads: int
    items: int
    big_thread_id: str
    child_thread_id: str  # a subagent thread
    seconds: float
    bytes: int


class _Writer:
    """Buffers events and projection rows; writes them in big transactions."""

    def __init__(self, conn: apsw.Connection) -> None:
        from t3d.domain.codec import event_payload
        from t3d.store.tables import apply_event

        self._conn = conn
        self._payload = event_payload
        self._apply = apply_event
        self._events: list[tuple[str, str | None, str, bytes, float]] = []
        self._final: list[tuple[Any, bytes]] = []
        self.count = 0

    def event(self, entity: Any, at: float, *, final: bool = False) -> bytes:
        from t3d.domain.events import updated

        event = updated(entity)
        payload = self._payload(event)
        self._events.append((event.kind, event.thread_id, entity.id, payload, at))
        if final:
            self._final.append((event, payload))
        self.count += 1
        if len(self._events) >= FLUSH_EVENTS:
            self.flush()
        return payload

    def project(self, entity: Any, payload: bytes) -> None:
        from t3d.domain.events import updated

        self._final.append((updated(entity), payload))

    def flush(self) -> None:
        with self._conn:
            self._conn.executemany(
                "INSERT INTO events(kind, thread_id, entity_id, payload, created_at) VALUES (?,?,?,?,?)",
                self._events,
            )
            for event, payload in self._final:
                self._apply(self._conn, event, payload)
        self._events.clear()
        self._final.clear()


class _Host:
    def __init__(self, shape: Shape, writer: _Writer) -> None:
        from t3d.domain.model import Project, Thread

        self.shape = shape
        self.rng = random.Random(shape.seed)
        self.w = writer
        self.now = START
        words_of_text = _TEXT.split()
        words = [self.rng.choice(words_of_text) for _ in range(60_000)]
        self.corpus = " ".join(words)
        self.ids = itertools.count(1)
        self.projects = [
            Project(
                id=self.uid(),
                path=f"/home/dev/src/repo-{i:02d}",
                title=f"repo-{i:02d}",
                created_at=self.tick(),
            )
            for i in range(shape.projects)
        ]
        for project in self.projects:
            self.w.project(project, self.w.event(project, project.created_at))
        self.threads: list[Any] = []
        for i in range(shape.threads):
            parent = (
                self.threads[self.rng.randrange(len(self.threads))].id
                if i > 10 and i % 10 == 0
                else None
            )
            project = self.projects[i % len(self.projects)]
            self.threads.append(
                Thread(
                    id=self.uid(),
                    project_id=project.id,
                    title=f"thread {i}: {self.text(20, 60)}",
                    provider="claude" if i % 7 else "codex",
                    model="claude-sonnet-4-5" if i % 7 else "gpt-5-codex",
                    runtime_mode="approval-required",
                    worktree_path=None,
                    branch=None,
                    parent_thread_id=parent,
                    status="idle",
                    created_at=self.tick(),
                )
            )
        self.turns = [0] * shape.threads
        self.items = 0
        self.thread_payload: dict[int, bytes] = {}
        for n, thread in enumerate(self.threads):
            self.thread_payload[n] = self.w.event(thread, thread.created_at)

    def uid(self) -> str:
        """A UUID-shaped id: random, so rows land all over their indexes, as real ids do."""
        r = self.rng.getrandbits
        return f"{r(32):08x}-{r(16):04x}-4{r(12):03x}-a{r(12):03x}-{next(self.ids):012x}"

    def tick(self, seconds: float = 0.2) -> float:
        self.now += self.rng.uniform(0.0, seconds)
        return self.now

    def text(self, low: int, high: int) -> str:
        size = self.rng.randint(low, high)
        start = self.rng.randrange(len(self.corpus) - size)
        return self.corpus[start : start + size]

    def put_thread(self, n: int, **changes: Any) -> None:
        self.threads[n] = attrs.evolve(self.threads[n], **changes)
        self.thread_payload[n] = self.w.event(self.threads[n], self.tick())

    def turn(self, n: int, items: int, *, leave_open: str | None = None) -> None:
        """One turn of thread ``n``: the user's message, then ``items`` items. ``leave_open``:
        end it ``running``, or ``waiting`` on a pending request, as a crash would leave it."""
        from t3d.domain.model import ProviderSession, RuntimeRequest, Turn, TurnItem

        thread = self.threads[n]
        self.turns[n] += 1
        turn = Turn(
            id=self.uid(),
            thread_id=thread.id,
            ordinal=self.turns[n],
            status="starting",
            requested_at=self.tick(60),
        )
        self.w.event(turn, turn.requested_at)
        self.put_thread(n, status="running")
        user = TurnItem(
            id=f"{turn.id}:user",
            thread_id=thread.id,
            turn_id=turn.id,
            ordinal=1,
            kind="user_message",
            status="completed",
            title=None,
            text=self.text(40, 600),
            data=None,
            updated_at=turn.requested_at,
        )
        self.w.event(user, user.updated_at, final=True)
        session = session_payload = None
        if self.turns[n] % 5 == 1 or leave_open:
            session = ProviderSession(
                id=self.uid(),
                thread_id=thread.id,
                provider=thread.provider,
                status="running",
                started_at=self.tick(),
                native_session_id=self.uid(),
                pid=4000 + n,
            )
            session_payload = self.w.event(session, session.started_at)
        running_at = self.tick()
        turn = attrs.evolve(turn, status="running", started_at=running_at)
        turn_payload = self.w.event(turn, running_at)
        ask_at = (
            self.rng.randint(2, items + 1)
            if leave_open is None and self.rng.randrange(6) == 0
            else None
        )
        for ordinal in range(2, items + 2):
            if ordinal == ask_at:
                self.ask(
                    n,
                    turn,
                    TurnItem(
                        **self.item_base(turn, ordinal),
                        kind="approval_request",
                        status="pending",
                        text="edit src/app.py",
                        updated_at=self.tick(),
                    ),
                    RuntimeRequest,
                )
            else:
                self.item(turn, ordinal, TurnItem)
        self.items += items + 1
        if leave_open is not None:
            if leave_open == "waiting":
                item = TurnItem(
                    **self.item_base(turn, items + 2),
                    kind="approval_request",
                    status="pending",
                    text="rm -rf build",
                    updated_at=self.tick(),
                )
                self.ask(n, turn, item, RuntimeRequest, answer=False)
                self.items += 1
            else:
                self.w.project(turn, turn_payload)
            assert session is not None and session_payload is not None
            self.w.project(session, session_payload)
            return
        usage = {
            "input_tokens": self.rng.randint(1000, 90000),
            "output_tokens": self.rng.randint(50, 4000),
        }
        cost = round(self.rng.uniform(0.001, 0.4), 4)
        done_at = self.tick(30)
        done = attrs.evolve(
            turn, status="completed", completed_at=done_at, usage=usage, cost_usd=cost
        )
        self.w.event(done, done_at, final=True)
        if session is not None:
            exited_at = self.tick()
            session = attrs.evolve(session, status="exited", exited_at=exited_at, exit_code=0)
            self.w.event(session, exited_at, final=True)
        self.put_thread(n, status="idle")

    def item_base(self, turn: Any, ordinal: int) -> dict[str, Any]:
        return {
            "id": f"{turn.id}:{self.uid()}",
            "thread_id": turn.thread_id,
            "turn_id": turn.id,
            "ordinal": ordinal,
            "title": None,
            "data": None,
        }

    def ask(self, n: int, turn: Any, item: Any, request_type: Any, *, answer: bool = True) -> None:
        """A permission prompt: the item and request open, the turn and thread wait; answered,
        all of it goes back to running (unanswered, it stays pending, as a crash leaves it)."""
        item = attrs.evolve(item, title="Edit", data={"tool": "Edit", "file_path": "src/app.py"})
        self.w.event(item, item.updated_at, final=not answer)
        request = request_type(
            id=self.uid(),
            thread_id=turn.thread_id,
            turn_id=turn.id,
            item_id=item.id,
            kind="permission",
            status="pending",
            created_at=self.tick(),
        )
        self.w.event(request, request.created_at, final=not answer)
        self.w.event(attrs.evolve(turn, status="waiting"), self.tick(), final=not answer)
        self.put_thread(n, status="waiting")
        if not answer:
            return
        at = self.tick(20)
        self.w.event(
            attrs.evolve(request, status="resolved", decision="allow", resolved_at=at),
            at,
            final=True,
        )
        self.w.event(attrs.evolve(item, status="allowed", updated_at=at), at, final=True)
        self.w.event(turn, at)
        self.put_thread(n, status="running")

    def item(self, turn: Any, ordinal: int, item_type: Any) -> None:
        """One item's snapshots as the provider streamed them; the last one is projected."""
        base = self.item_base(turn, ordinal)
        roll = self.rng.random()
        if roll < 0.45:  # streamed text: growing snapshots, ~50 ms apart
            kind = "assistant_message" if roll < 0.3 else "reasoning"
            text = self.text(60, 1500)
            steps = self.rng.randint(1, 6)
            for step in range(1, steps + 1):
                status = "completed" if step == steps else "streaming"
                item = item_type(
                    **base,
                    kind=kind,
                    status=status,
                    text=text[: len(text) * step // steps],
                    updated_at=self.tick(0.1),
                )
                self.w.event(item, item.updated_at, final=step == steps)
            return
        kind = "command" if roll < 0.7 else "file_change" if roll < 0.8 else "tool_call"
        output = self.text(20_000, 60_000) if self.rng.random() < 0.015 else self.text(20, 900)
        data = {"input": self.text(10, 200)}
        running = item_type(
            **{**base, "title": kind, "data": data},
            kind=kind,
            status="running",
            text=None,
            updated_at=self.tick(),
        )
        self.w.event(running, running.updated_at)
        done = attrs.evolve(
            running, status="completed", data={**data, "output": output}, updated_at=self.tick(2)
        )
        self.w.event(done, done.updated_at, final=True)


def generate(out: Path, shape: Shape) -> Generated:
    """Write the database to ``out`` (which must not exist yet)."""
    from t3d.store.schema import migrate

    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    started = time.monotonic()
    conn = apsw.Connection(os.fspath(partial))
    for pragma in (
        "PRAGMA journal_mode=OFF",
        "PRAGMA synchronous=OFF",
        "PRAGMA cache_size=-524288",
    ):
        conn.execute(pragma)
    migrate(conn)
    writer = _Writer(conn)
    host = _Host(shape, writer)
    # The big thread (index 0) grows in step with the whole, so it is interleaved in
    # time (and tops up at the end); the others are picked by a skewed weight.
    big_items = 0
    weights = list(
        itertools.accumulate(host.rng.paretovariate(1.2) for _ in range(shape.threads - 1))
    )
    while writer.count < shape.events * 0.995 or big_items < shape.big_items:
        if (
            big_items < shape.big_items
            and big_items * shape.events <= shape.big_items * writer.count
        ):
            items = max(1, min(ITEMS_PER_BIG_TURN, shape.big_items - big_items - 1))
            host.turn(0, items)
            big_items += items + 1
            continue
        n = 1 + bisect.bisect(weights, host.rng.random() * weights[-1])
        host.turn(min(n, shape.threads - 1), host.rng.randint(2, 14))
    for i, n in enumerate(host.rng.sample(range(1, shape.threads), max(2, shape.threads // 200))):
        host.turn(n, host.rng.randint(1, 4), leave_open="waiting" if i % 3 == 0 else "running")
    for n, thread in enumerate(host.threads):
        writer.project(thread, host.thread_payload[n])
    writer.flush()
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    partial.rename(out)
    child = next(t.id for t in host.threads if t.parent_thread_id is not None)
    return Generated(
        out,
        writer.count,
        shape.threads,
        host.items,
        host.threads[0].id,
        child,
        time.monotonic() - started,
        out.stat().st_size,
    )


def command(args: Any) -> int:
    """``python -m bench gen-db``: write the database and say what it holds."""
    try:
        shape = Shape.for_events(
            args.events, threads=args.threads, big_items=args.big_thread_items, seed=args.seed
        )
        done = generate(Path(args.out), shape)
    except (ValueError, FileExistsError) as exc:
        print(f"gen-db: {exc}", file=sys.stderr)
        return 2
    print(
        f"{done.path}: {done.events:,} events, {done.threads:,} threads, {done.items:,} items, "
        f"{done.bytes / 2**20:,.0f} MiB in {done.seconds:.1f} s; "
        f"big thread {done.big_thread_id} ({shape.big_items:,} items), a subagent thread {done.child_thread_id}"
    )
    return 0
