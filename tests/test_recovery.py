"""Restart recovery on a real SQLite file: what it closes, and what it leaves to agents that
are still alive; and the rate limit on repeated provider warnings (pure)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from t3d.domain import commands as c
from t3d.domain.events import AnswerProviderRequest, InterruptProviderTurn, StartProviderTurn
from t3d.domain.model import ProviderSession, TurnItem
from t3d.providers.log_limit import LogLimiter
from t3d.store.store import Store, open_store


def _lost(error: BaseException | None) -> None:
    raise AssertionError(f"writer lost: {error!r}")


async def _waiting_turn(store: Store, thread: str) -> None:
    """A thread whose turn waits on a prompt, its session live, a turn queued behind it, an
    answer given and an interrupt asked (so the outbox holds their effects)."""
    await store.execute(c.CreateThread(thread, "p", "replay"))
    await store.execute(c.StartTurn(thread, f"{thread}-1", "go"))
    await store.execute(c.MarkTurnRunning(f"{thread}-1"))
    session = ProviderSession(id=f"{thread}-s", thread_id=thread, provider="replay", status="running", started_at=1.0)
    await store.execute(c.RecordSession(session))
    for n in (1, 2):
        item = TurnItem(f"{thread}-1:request:{n}", thread, f"{thread}-1", 0, "approval_request", "pending", None, None, None, 1.0)
        await store.execute(c.OpenRequest(f"{thread}-1", f"{thread}-1:{n}", "permission", item))
    await store.execute(c.RespondToRequest(f"{thread}-1:1", "allow"))
    await store.execute(c.InterruptTurn(thread))
    await store.execute(c.StartTurn(thread, f"{thread}-2", "next"))


async def test_recovery_closes_turns_without_an_agent_and_keeps_those_of_live_agents(tmp_path: Path) -> None:
    """Thread A's agent is still alive, thread B's is gone: B's turn ends `interrupted`
    (`server_restart`), its pending request expires, its session is recorded exited and its
    queued turn starts; A's turn, pending request, queued turn and session stay as they were,
    and of the effects left in the outbox A's answer and interrupt still run while its turn
    start and all of B's are superseded."""
    db = tmp_path / "db"
    async with open_store(db, on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", str(tmp_path)))
        for thread in ("A", "B"):
            await _waiting_turn(store, thread)
    async with open_store(db, on_writer_lost=_lost, recover=False) as store:
        await store.recover_after_restart(frozenset({"A-s"}))
        a, b = await store.snapshot("A"), await store.snapshot("B")
        assert a is not None and b is not None
        assert [(t["id"], t["status"]) for t in a["turns"]] == [("A-1", "waiting"), ("A-2", "queued")]
        assert [r["id"] for r in a["requests"]] == ["A-1:2"]
        assert [(t["id"], t["status"], t["reason"]) for t in b["turns"]] == [
            ("B-1", "interrupted", "server_restart"),
            ("B-2", "starting", None),
        ]
        assert b["requests"] == []
        assert await store.reattachable_sessions() == {"A-s": "A"}
        effects = [effect for _, effect in await store.pending_effects()]
        assert [type(e).__name__ for e in effects if e.thread_id == "A"] == ["AnswerProviderRequest", "InterruptProviderTurn"]
        # B's: recovery's own decisions only (its closed turn's checkpoint, its next turn).
        assert sorted(type(e).__name__ for e in effects if e.thread_id == "B") == ["CaptureCheckpoint", "StartProviderTurn"]
        [start] = [e for e in effects if isinstance(e, StartProviderTurn)]
        assert start.turn_id == "B-2"
        assert isinstance(effects[0], AnswerProviderRequest | InterruptProviderTurn)


async def test_recovery_without_live_agents_closes_everything(tmp_path: Path) -> None:
    """Without agents (a plain `open_store`), every open turn is closed as before."""
    db = tmp_path / "db"
    async with open_store(db, on_writer_lost=_lost) as store:
        await store.execute(c.CreateProject("p", str(tmp_path)))
        await _waiting_turn(store, "A")
    async with open_store(db, on_writer_lost=_lost) as store:
        snapshot = await store.snapshot("A")
        assert snapshot is not None
        assert [(t["id"], t["status"]) for t in snapshot["turns"]] == [("A-1", "interrupted"), ("A-2", "starting")]
        assert snapshot["requests"] == []
        assert await store.reattachable_sessions() == {}


def test_repeated_warnings_are_logged_a_few_at_a_time_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    """Per window: the first `burst` warnings in full, then one summary with the count and the
    last one, written when the next window starts or at `flush`."""
    now = [0.0]
    limiter = LogLimiter(logging.getLogger("t3d.test"), "thread T", burst=3, interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "t3d.test"):
        for n in range(1000):
            limiter.warning(f"bad line {n}")
        assert [r.getMessage() for r in caplog.records] == ["thread T: bad line 0", "thread T: bad line 1", "thread T: bad line 2"]
        now[0] = 61.0
        limiter.warning("bad line 1000")
        limiter.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[3] == "thread T: 997 more like that in the last 61 s (the last: bad line 999)"
    assert messages[4:] == ["thread T: bad line 1000"]
