"""What the restart tests (tests/test_reattach.py for Claude, tests/test_codex_reattach.py for
Codex) share: the threads and turns a run started, waiting for their ends, and each turn's
final record with ids and times taken out, to compare a restarted run with a control run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import trio
from served import Served, query

from t3d.domain import commands as c
from t3d.domain.events import AnswerProviderRequest
from t3d.store.store import open_store

TERMINAL = ("completed", "failed", "interrupted", "cancelled")


class Started:
    """The threads of a run and their open turns, by role."""

    def __init__(self) -> None:
        self.threads: dict[str, str] = {}  # role -> thread id
        self.turns: dict[str, str] = {}  # role -> turn id
        self.request = ""


async def wait_terminal(daemon: Served, turn_ids: list[str]) -> None:
    marks = ",".join("?" * len(turn_ids))
    while True:
        rows = await query(daemon.db_path, f"SELECT status FROM turns WHERE id IN ({marks})", *turn_ids)
        if len(rows) == len(turn_ids) and all(s in TERMINAL for (s,) in rows):
            return
        await trio.sleep(0.1)


async def outcome(daemon: Served, started: Started) -> dict[str, Any]:
    """Every turn of the run's threads and its items and requests, with ids and times taken out."""
    labels = {**{v: f"<{k}>" for k, v in started.threads.items()}}
    result: dict[str, Any] = {}
    for role, thread_id in started.threads.items():
        turns = await query(daemon.db_path, "SELECT id, body FROM turns WHERE thread_id = ? ORDER BY ordinal", thread_id)
        for turn_id, body in turns:
            labels[turn_id] = f"<{role}:{orjson.loads(body)['ordinal']}>"
    for thread_id in started.threads.values():
        for turn_id, body in await query(daemon.db_path, "SELECT id, body FROM turns WHERE thread_id = ? ORDER BY ordinal", thread_id):
            turn = orjson.loads(body)
            items = await query(daemon.db_path, "SELECT body FROM items WHERE turn_id = ? ORDER BY ordinal", turn_id)
            requests = await query(daemon.db_path, "SELECT body FROM requests WHERE turn_id = ?", turn_id)
            record = {
                "turn": {k: turn.get(k) for k in ("ordinal", "status", "reason", "error", "usage", "cost_usd")},
                "items": [_without(orjson.loads(b), "updated_at") for (b,) in items],
                "requests": [_without(orjson.loads(b), "created_at", "resolved_at") for (b,) in requests],
            }
            text = orjson.dumps(record).decode()
            for real, label in labels.items():
                text = text.replace(real, label)
            result[labels[turn_id]] = orjson.loads(text)
    return result


def _without(entity: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in entity.items() if k not in names}


async def answer_in_the_database_only(db: Path, request_id: str) -> None:
    """As if the dead daemon had committed the answer and handed it to the session, which
    never wrote it: resolve the request, and mark its effect done."""
    async with open_store(db, on_writer_lost=lambda error: None, recover=False) as store:
        await store.execute(c.RespondToRequest(request_id, "allow"))
        effects = await store.pending_effects()
        answers = [i for i, effect in effects if isinstance(effect, AnswerProviderRequest)]
        assert len(answers) == 1
        await store.mark_effects_done(answers)
