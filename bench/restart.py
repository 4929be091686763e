"""Restarting the daemon during a run, on the same state dir and port, and what it cost.

``run_restarts`` (a coordinator task) restarts the daemon every ``every_s`` seconds of the
window: it notes the agents (provider processes) alive, sends the signal (TERM: a
service manager's stop; KILL: a crash), waits for the process to end (SIGKILL after the
grace), starts ``t3d serve`` again and times until ``/api/health`` answers. The agents
noted at a restart and gone by the next one (or the window's end) count as killed. The
load's sessions and subscribers connect again on their own (``reconnect``).

After the run, `restart_figures` reads the database: every turn that ended with reason
``server_restart``, and for each turn in flight at a restart (started before the signal,
not ended before it) its status and whether its final assistant text equals the
recording's. The replay plays the fixture's turns in order and loops, and a provider
process started again (``--resume``) begins at the first: so the recording's turn for a
turn is its rank among the turns its provider process (by pid) has started, modulo the
fixture's turns.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import apsw
import attrs
import trio

from bench import daemon as d
from bench import procfs
from bench.actors import sleep_until
from bench.figures import RESTART_FIGURES
from bench.sampler import Sampler
from bench.stats import maximum, percentile

SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
PROVIDER_MARKS = ("fake_claude", "fake_codex")


@attrs.define
class RestartRecord:
    at: float  # when the signal was sent (monotonic)
    signal: str
    agents: list[procfs.ProcessId]  # alive at the signal
    exit_code: int | None = None
    stopped_s: float | None = None  # signal -> the old process ended
    serving_s: float | None = None  # signal -> the new daemon answers /api/health
    killed: int | None = None  # of ``agents``, gone by the next restart or the window's end
    error: str | None = None

    def row(self, origin: float) -> dict[str, Any]:
        return {
            "at_s": round(self.at - origin, 3), "signal": self.signal, "exit_code": self.exit_code,
            "stopped_s": self.stopped_s and round(self.stopped_s, 3),
            "serving_s": self.serving_s and round(self.serving_s, 3),
            "agents": len(self.agents), "agents_killed": self.killed, "error": self.error,
        }  # fmt: skip


def agents_alive(daemon: d.RunningDaemon) -> list[procfs.ProcessId]:
    """The provider processes of this run that are alive now (under the daemon or the spawner)."""
    spawner = procfs.find_spawner(daemon.state.spawner_socket)
    roots = [daemon.process.pid, *([spawner] if spawner is not None else [])]
    found = []
    for pid in procfs.descendants(roots):
        if pid != spawner and any(arg.endswith(PROVIDER_MARKS) for arg in procfs.cmdline(pid)):
            ident = procfs.ProcessId.of(pid)
            if ident is not None:
                found.append(ident)
    return found


def settle(record: RestartRecord) -> None:
    """Count the agents noted at ``record``'s restart that are gone now."""
    if record.killed is None:
        record.killed = sum(1 for agent in record.agents if not agent.alive())


async def restart_once(daemon: d.RunningDaemon, sampler: Sampler, sig: str) -> RestartRecord:
    """One restart, shielded (bounded by the stop grace and the start timeout): a run that
    ends meanwhile finds a daemon to stop."""
    with trio.CancelScope(shield=True):
        record = await _restart(daemon, sampler, sig)
    return record


async def _restart(daemon: d.RunningDaemon, sampler: Sampler, sig: str) -> RestartRecord:
    record = RestartRecord(time.monotonic(), sig, await trio.to_thread.run_sync(agents_alive, daemon))
    process = daemon.process
    process.send_signal(SIGNALS[sig])
    with trio.move_on_after(d.STOP_GRACE_S):
        await process.wait()
    if process.returncode is None:
        record.error = f"did not stop within {d.STOP_GRACE_S:g} s of SIG{sig}; killed"
        process.kill()
    record.exit_code = await process.wait()
    record.stopped_s = time.monotonic() - record.at
    try:
        await d.restart_process(daemon)
    except d.DaemonFailed as exc:
        record.error = f"the daemon did not serve again: {exc}"
        return record
    record.serving_s = time.monotonic() - record.at
    sampler.daemon_pid = daemon.process.pid
    return record


async def run_restarts(
    daemon: d.RunningDaemon, sampler: Sampler, every_s: float, sig: str, start: float, end: float,
    records: list[RestartRecord],
) -> None:  # fmt: skip
    """Restart at start + every_s, start + 2 every_s, ... while before ``end``; stop at the
    first restart after which the daemon does not serve."""
    at = start + every_s
    while at < end:
        await sleep_until(at)
        if records:
            await trio.to_thread.run_sync(settle, records[-1])
        records.append(await restart_once(daemon, sampler, sig))
        if records[-1].serving_s is None:
            return
        at += every_s


# --- after the run -------------------------------------------------------------------


def fixture_final_texts(fixture: Path) -> list[str | None]:
    """Per turn of a fixture transcript, the text of its last assistant message: the last
    text block (Claude's stream-json), or the last completed ``agentMessage`` (a Codex
    app-server recording, whose turns start at each ``turn/start``)."""
    texts: list[str | None] = []
    for raw in fixture.read_text().splitlines():
        if not raw.strip():
            continue
        host = raw.startswith(">>> ")
        obj = json.loads(raw[4:] if host else raw)
        if host and (obj.get("type") == "user" or obj.get("method") == "turn/start"):
            texts.append(None)
        elif not host and texts and obj.get("type") == "assistant":
            for block in (obj.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "text":
                    texts[-1] = block.get("text")
        elif not host and texts and obj.get("method") == "item/completed":
            item = (obj.get("params") or {}).get("item") or {}
            if item.get("type") == "agentMessage":
                texts[-1] = item.get("text")
    return texts


def read_turns(db: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Every turn (id -> status, ordinal, reason, and ``played``: its rank among the turns
    its provider process started, from 1) and each turn's last assistant text."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        turns: dict[str, dict[str, Any]] = {}
        for tid, thread_id, ordinal, status, body, provider in conn.execute(
            "SELECT t.id, t.thread_id, t.ordinal, t.status, t.body, json_extract(th.body, '$.provider') "
            "FROM turns t LEFT JOIN threads th ON th.id = t.thread_id"
        ):
            turn = json.loads(body)
            turns[tid] = {"status": status, "ordinal": ordinal, "reason": turn.get("reason"),
                          "thread_id": thread_id, "started_at": turn.get("started_at"), "provider": provider}  # fmt: skip
        processes: dict[tuple[str, int], list[float]] = {}  # (thread, pid) -> [first start, last exit]
        for thread_id, body in conn.execute("SELECT thread_id, body FROM sessions"):
            session = json.loads(body)
            if not isinstance(session.get("pid"), int) or session.get("started_at") is None:
                continue
            span = processes.setdefault((thread_id, session["pid"]), [session["started_at"], session["started_at"]])
            span[0] = min(span[0], session["started_at"])
            span[1] = max(span[1], session.get("exited_at") or float("inf"))
        _rank_by_process(turns, processes)
        final: dict[str, str | None] = {}
        for turn_id, body in conn.execute("SELECT turn_id, body FROM items ORDER BY turn_id, ordinal"):
            item = json.loads(body)
            if item.get("kind") == "assistant_message":
                final[turn_id] = item.get("text")
        return turns, final
    finally:
        conn.close()


def _rank_by_process(turns: dict[str, dict[str, Any]], processes: dict[tuple[str, int], list[float]]) -> None:
    for (thread_id, _pid), (first, last) in processes.items():
        mine = sorted(
            (t for t in turns.values() if t["thread_id"] == thread_id and t["started_at"] is not None
             and first <= t["started_at"] <= last),
            key=lambda t: t["started_at"],
        )  # fmt: skip
        for rank, turn in enumerate(mine, 1):
            turn["played"] = rank


def restart_figures(
    records: list[RestartRecord], load_turns: list[dict[str, Any]], db: Path, fixtures: dict[str, Path]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The restart figures, and one row per turn in flight at a restart (``fixtures``: the
    recording each provider plays)."""
    fig: dict[str, Any] = {"restarts": len(records)}
    serving = [r.serving_s for r in records if r.serving_s is not None]
    fig["restart_serving_p50_s"], fig["restart_serving_max_s"] = percentile(serving, 50), maximum(serving)
    fig["restart_stop_max_s"] = maximum(r.stopped_s for r in records if r.stopped_s is not None)
    fig["agents_killed"] = sum(r.killed or 0 for r in records)
    turns, final = read_turns(db) if db.exists() else ({}, {})
    fig["turns_server_restart"] = sum(1 for t in turns.values() if t["reason"] == "server_restart")
    recorded = {provider: fixture_final_texts(path) for provider, path in fixtures.items()}
    rows = []
    for t in load_turns:
        hit = next((r for r in records if t["start"] < r.at and (t["end"] is None or t["end"] > r.at)), None)
        if hit is None:
            continue
        stored = turns.get(t["turn_id"], {})
        played = stored.get("played")
        expected = recorded.get(stored.get("provider") or "", [])
        want = expected[(played - 1) % len(expected)] if played and expected else None
        rows.append({
            "turn_id": t["turn_id"], "session": t["session"], "restart_at": hit.at,
            "ordinal": stored.get("ordinal"), "status": stored.get("status"), "reason": stored.get("reason"),
            "text_equal": want is not None and final.get(t["turn_id"]) == want,
        })  # fmt: skip
    fig["restarted_turns"] = len(rows)
    fig["restarted_turns_text_equal"] = sum(1 for r in rows if r["text_equal"])
    return fig, rows


def no_restart_figures(fig: dict[str, Any], missing: dict[str, str]) -> None:
    for name in RESTART_FIGURES:
        fig[name] = None
        missing[name] = "not measured: run with --restart-every S"


def note(record: RestartRecord, index: int) -> str:
    said = (
        f"restart {index} (SIG{record.signal}): exit status {record.exit_code}, stopped in "
        f"{_s(record.stopped_s)}, serving again {_s(record.serving_s)} after the signal, "
        f"{record.killed if record.killed is not None else '?'} of {len(record.agents)} agents killed"
    )
    return said + (f"; {record.error}" if record.error else "")


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"
