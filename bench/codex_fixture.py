"""The benchmark's Codex replay fixtures, built from the recorded codex-cli 0.171.0 lines.

Theory of operation: every line of a built fixture is a line of the recording
``codex-0.171.0_app-server_multiturn`` (the copy bundled in ``replay_fixtures/codex``, equal
to ``../shared/providers/fixtures/codex``) with only its ids, its text pieces and its timing
changed, as ``bench/fixture.py`` does for Claude. A turn is assembled from the recorded
segments: the host's ``turn/start`` and its answer, ``turn/started`` and the user message
echo, per tool call an agent message streamed as ``item/agentMessage/delta`` lines followed by
a ``commandExecution`` item (started, completed with its output, then the token and rate-limit
updates), the prompted one asked with ``item/commandExecution/requestApproval`` and answered
by a host response, and a final streamed agent message with ``turn/completed``. The timing
and the shape of the turns are the Claude fixture's (`bench.fixture.BENCH_TURNS`): a turn
lasts about 6 s, its first streamed text arrives about 1.7 s in, it has 150-300 stdout lines
and 1-3 tool calls, and one turn in five asks for approval. The recorded commands are not
run by the fake, so no turn changes a file (the Claude fixture's prompted Edit does).

Rules: pure and deterministic, like `bench.fixture`; ``python -m bench.codex_fixture``
writes ``replay_fixtures/bench/codex-*``; ``tests/test_bench.py`` checks that the files there
are what the builder makes and that the fake codex replays them through the real daemon.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path

import attrs

from bench.fixture import (
    BENCH_TURNS,
    BURST_DELTA_GAP_MS,
    BURST_DELTAS,
    MESSAGE_START_BEFORE_FIRST_ITEM_MS,
    MODEL_LATENCY_MS,
    OUT_DIR,
    REPO,
    STRUCTURAL_MS,
    TOOL_RUN_MS,
    FixtureFiles,
    TurnPlan,
    TurnTiming,
    _dump,
    _split,
    write_files,
)
from bench.recording import HOST, Json, Recording

RECORDING = REPO / "replay_fixtures" / "codex" / "codex-0.171.0_app-server_multiturn.jsonl"
TURNS_NAME = "codex-0.171.0_bench_turns"
BURST_NAME = "codex-0.171.0_bench_burst"
WARNING_MS = 8  # turn/start -> the model-metadata warning (recorded: 7 ms)


def _method(name: str) -> object:
    return lambda obj: obj.get("method") == name


def _item(method: str, kind: str) -> object:
    return lambda obj: obj.get("method") == method and obj["params"]["item"]["type"] == kind


@attrs.frozen
class CodexTemplates:
    """One recorded line of each kind a Codex turn needs, and the recorded text pieces."""

    header: tuple[tuple[bool, Json], ...]  # initialize .. thread/started, as recorded
    thread_id: str
    turn_start: Json
    warning: Json
    turn_response: Json
    status_active: Json
    turn_started: Json
    user_started: Json
    user_completed: Json
    agent_started: Json
    agent_delta: Json
    agent_completed: Json
    waiting: Json
    command_started: Json
    approval: Json
    approval_answer: Json
    resolved: Json
    command_completed: Json
    token_usage: Json
    rate_limits: Json
    status_idle: Json
    turn_completed: Json
    pieces: tuple[str, ...]

    @classmethod
    def from_recording(cls, recording: Recording) -> CodexTemplates:
        find = recording.find
        lines = recording.lines
        first_turn = next(i for i, (host, obj) in enumerate(lines) if host and obj.get("method") == "turn/start")
        header = lines[:first_turn]
        response = next(obj for host, obj in header if not host and "thread" in (obj.get("result") or {}))
        pieces = tuple(
            obj["params"]["delta"]
            for host, obj in lines
            if not host and obj.get("method") == "item/agentMessage/delta" and obj["params"]["delta"].strip()
        )
        return cls(
            header=header,
            thread_id=response["result"]["thread"]["id"],
            turn_start=find(_method("turn/start"), host=True),  # type: ignore[arg-type]
            warning=find(_method("warning")),  # type: ignore[arg-type]
            turn_response=find(lambda o: "turn" in (o.get("result") or {})),
            status_active=find(lambda o: o.get("method") == "thread/status/changed" and o["params"]["status"] == {"type": "active", "activeFlags": []}),
            turn_started=find(_method("turn/started")),  # type: ignore[arg-type]
            user_started=find(_item("item/started", "userMessage")),  # type: ignore[arg-type]
            user_completed=find(_item("item/completed", "userMessage")),  # type: ignore[arg-type]
            agent_started=find(_item("item/started", "agentMessage")),  # type: ignore[arg-type]
            agent_delta=find(_method("item/agentMessage/delta")),  # type: ignore[arg-type]
            agent_completed=find(_item("item/completed", "agentMessage")),  # type: ignore[arg-type]
            waiting=find(lambda o: o.get("method") == "thread/status/changed" and o["params"]["status"].get("activeFlags") == ["waitingOnApproval"]),
            command_started=find(_item("item/started", "commandExecution")),  # type: ignore[arg-type]
            approval=find(_method("item/commandExecution/requestApproval")),  # type: ignore[arg-type]
            approval_answer=find(lambda o: isinstance((o.get("result") or {}).get("decision"), str), host=True),
            resolved=find(_method("serverRequest/resolved")),  # type: ignore[arg-type]
            command_completed=find(_item("item/completed", "commandExecution")),  # type: ignore[arg-type]
            token_usage=find(_method("thread/tokenUsage/updated")),  # type: ignore[arg-type]
            rate_limits=find(_method("account/rateLimits/updated")),  # type: ignore[arg-type]
            status_idle=find(lambda o: o.get("method") == "thread/status/changed" and o["params"]["status"] == {"type": "idle"}),
            turn_completed=find(_method("turn/completed")),  # type: ignore[arg-type]
            pieces=pieces,
        )


@attrs.define
class _Ids:
    rng: random.Random

    def uuid(self) -> str:  # the recording's ids are UUIDv7-shaped
        h = f"{self.rng.getrandbits(128):032x}"
        return f"01a2268d-{h[8:12]}-7{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:32]}"

    def hex(self, n: int) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"


# (host?, object, gap kind); gap kinds as in bench.fixture ("stream" shares the free time).
Planned = tuple[bool, Json, str]


class _TurnWriter:
    def __init__(self, t: CodexTemplates, ids: _Ids, pieces: Iterator[str], turn_id: str) -> None:
        self.t, self.ids, self.pieces, self.turn_id = t, ids, pieces, turn_id
        self.out: list[Planned] = []
        self.usage = 0

    def emit(self, obj: Json, gap: str, *, host: bool = False) -> Json:
        params = obj.get("params")
        if isinstance(params, dict) and "turnId" in params:
            params["turnId"] = self.turn_id
        self.out.append((host, obj, gap))
        return obj

    def message(self, deltas: int, first_gap: str, start_gap: str) -> Json:
        item_id = "msg_mock_" + self.ids.hex(12)
        started = copy.deepcopy(self.t.agent_started)
        started["params"]["item"]["id"] = item_id
        self.emit(started, start_gap)
        text = ""
        for n in range(deltas):
            piece = next(self.pieces)
            delta = copy.deepcopy(self.t.agent_delta)
            delta["params"].update(itemId=item_id, delta=piece)
            self.emit(delta, first_gap if n == 0 else "stream")
            text += piece
        done = copy.deepcopy(self.t.agent_completed)
        done["params"]["item"].update(id=item_id, text=text)
        self.emit(done, "fixed")
        return done["params"]["item"]  # type: ignore[no-any-return]

    def command(self, *, prompt: bool) -> None:
        call_id = "call_mock_" + self.ids.hex(12)
        if prompt:
            self.emit(copy.deepcopy(self.t.waiting), "fixed")
        started = copy.deepcopy(self.t.command_started)
        started["params"]["item"]["id"] = call_id
        self.emit(started, "fixed")
        if prompt:
            approval = copy.deepcopy(self.t.approval)
            approval["params"]["itemId"] = call_id
            self.emit(approval, "fixed")
            self.emit(copy.deepcopy(self.t.approval_answer), "same", host=True)
            self.emit(copy.deepcopy(self.t.resolved), "fixed")
            self.emit(copy.deepcopy(self.t.status_active), "fixed")
        done = copy.deepcopy(self.t.command_completed)
        done["params"]["item"]["id"] = call_id
        self.emit(done, "tool")
        self.usage_update()

    def usage_update(self) -> None:
        self.usage += 1
        usage = copy.deepcopy(self.t.token_usage)
        last = usage["params"]["tokenUsage"]["last"]
        usage["params"]["tokenUsage"]["total"] = {k: v * self.usage for k, v in last.items()}
        self.emit(usage, "fixed")
        self.emit(copy.deepcopy(self.t.rate_limits), "fixed")


def _overhead_lines(plan: TurnPlan) -> int:
    """Stdout lines of a turn that are not text deltas (for a target line count)."""
    turn = 6 + 4  # warning .. user echo; status idle, turn/completed and the last usage
    per_tool = 2 + 4  # the message's start and end; the command's start, end and usage
    return turn + plan.tools * per_tool + (4 if plan.prompt else 0) + 2


def plan_turn(plan: TurnPlan, t: CodexTemplates, ids: _Ids, pieces: Iterator[str], host_id: int) -> list[tuple[bool, Json, int]]:
    """One turn's lines with their times (ms after the host's turn/start)."""
    return _schedule(_turn_lines(plan, t, ids, pieces, host_id), plan)


def _turn_lines(plan: TurnPlan, t: CodexTemplates, ids: _Ids, pieces: Iterator[str], host_id: int) -> list[Planned]:
    turn_id = ids.uuid()
    w = _TurnWriter(t, ids, pieces, turn_id)
    start = copy.deepcopy(t.turn_start)
    start["id"] = host_id
    start["params"]["input"][0]["text"] = "bench turn"
    w.emit(start, "start", host=True)
    w.emit(copy.deepcopy(t.warning), "init")
    response = copy.deepcopy(t.turn_response)
    response["id"] = host_id
    response["result"]["turn"].update(id=turn_id, rootTurnId=turn_id)
    w.emit(response, "fixed")
    w.emit(copy.deepcopy(t.status_active), "fixed")
    started = copy.deepcopy(t.turn_started)
    started["params"]["turn"].update(id=turn_id, rootTurnId=turn_id)
    w.emit(started, "fixed")
    user_id = ids.uuid()
    for template in (t.user_started, t.user_completed):
        user = copy.deepcopy(template)
        user["params"]["item"]["id"] = user_id
        user["params"]["item"]["content"][0]["text"] = "bench turn"
        w.emit(user, "fixed")
    deltas = _split(plan.lines - _overhead_lines(plan), plan.tools + 1, ids.rng)
    for n in range(plan.tools):
        w.message(deltas[n], "first_item" if n == 0 else "stream", "message_start" if n == 0 else "model")
        w.command(prompt=plan.prompt and n == 0)
    alone = plan.tools == 0
    final = w.message(deltas[-1], "first_item" if alone else "stream", "message_start" if alone else "model")
    w.usage_update()
    w.emit(copy.deepcopy(t.status_idle), "fixed")
    done = copy.deepcopy(t.turn_completed)
    done["params"]["turn"].update(id=turn_id, rootTurnId=turn_id, items=[final], durationMs=plan.duration_ms)
    w.emit(done, "fixed")
    return w.out


def _schedule(planned: list[Planned], plan: TurnPlan) -> list[tuple[bool, Json, int]]:
    fixed = {"start": 0, "same": 0, "fixed": STRUCTURAL_MS, "model": MODEL_LATENCY_MS, "tool": TOOL_RUN_MS, "init": WARNING_MS}
    gaps = [g for _, _, g in planned]
    after_first = gaps[gaps.index("first_item") + 1 :]
    streams = after_first.count("stream")
    unit = (plan.duration_ms - plan.first_item_ms - sum(fixed.get(g, 0) for g in after_first)) / streams
    if unit <= 0:
        raise ValueError(f"a turn of {plan.lines} lines cannot last only {plan.duration_ms} ms")
    times: list[tuple[bool, Json, int]] = []
    now = 0.0
    for host, obj, gap in planned:
        if gap == "first_item":
            now = plan.first_item_ms
        elif gap == "message_start":
            now = plan.first_item_ms - MESSAGE_START_BEFORE_FIRST_ITEM_MS
        elif gap == "stream":
            now += unit
        else:
            now += fixed[gap]
        times.append((host, obj, round(now)))
    return times


def _files(t: CodexTemplates, turns: list[list[tuple[bool, Json, int]]], meta: Json) -> FixtureFiles:
    lines: list[str] = []
    timing: list[str] = []
    for at, (host, obj) in enumerate(t.header):  # the recorded handshake, 1 ms apart
        timing.append(f"{at}\t{'in' if host else 'out'}\t{len(lines)}")
        lines.append((HOST if host else "") + _dump(obj))
    base = len(t.header) + 10
    for turn in turns:
        for host, obj, at in turn:
            timing.append(f"{base + at}\t{'in' if host else 'out'}\t{len(lines)}")
            lines.append((HOST if host else "") + _dump(obj))
        base += turn[-1][2] + 300  # the host's next turn/start, 0.3 s later (as recorded)
    return FixtureFiles("\n".join(lines) + "\n", "\n".join(timing) + "\n", json.dumps(meta, indent=1) + "\n")


def _meta(turns: list[str], plan: object) -> Json:
    recorded = json.loads((RECORDING.parent / "codex-0.171.0_app-server_multiturn.meta.json").read_text())
    return {
        "argv": recorded["argv"],
        "turns": turns,
        "decisions": {"commandExecution": "accept"},
        "exit_code": 0,
        "built_by": "python -m bench.codex_fixture (bench/codex_fixture.py) from codex-0.171.0_app-server_multiturn",
        "plan": plan,
    }


def build_bench_turns(recording: str, plans: tuple[TurnPlan, ...] = BENCH_TURNS, seed: int = 3) -> FixtureFiles:
    """The realistic fixture: ``plans`` as turns of recorded lines, retimed."""
    t = CodexTemplates.from_recording(Recording.parse(recording))
    ids = _Ids(random.Random(seed))
    pieces = _cycle(t.pieces)
    turns = [plan_turn(p, t, ids, pieces, 3 + i) for i, p in enumerate(plans)]
    meta = _meta(["bench turn"] * len(plans), [attrs.asdict(p) for p in plans])
    meta["stdout_lines_per_turn"] = [sum(1 for host, _, _ in turn if not host) for turn in turns]
    return _files(t, turns, meta)


def build_burst(recording: str, seed: int = 5) -> FixtureFiles:
    """The burst fixture: one agent message streamed as 5 deltas 20 ms apart, no tools."""
    t = CodexTemplates.from_recording(Recording.parse(recording))
    ids = _Ids(random.Random(seed))
    plan = TurnPlan(tools=0, prompt=False, lines=10 + 2 + BURST_DELTAS, duration_ms=WARNING_MS + BURST_DELTAS * BURST_DELTA_GAP_MS)
    fixed = {"start": 0, "init": WARNING_MS, "fixed": 1, "message_start": 1, "first_item": BURST_DELTA_GAP_MS, "stream": BURST_DELTA_GAP_MS}
    now, timed = 0, []
    for host, obj, gap in _turn_lines(plan, t, ids, _cycle(t.pieces), 3):
        now += fixed[gap]
        timed.append((host, obj, now))
    return _files(t, [timed], _meta(["burst"], {"text_deltas": BURST_DELTAS, "delta_gap_ms": BURST_DELTA_GAP_MS}))


def _cycle(pieces: tuple[str, ...]) -> Iterator[str]:
    while True:
        yield from pieces


# --- reading a fixture back ------------------------------------------------------------


def turn_timings(jsonl: str, timing: str) -> list[TurnTiming]:
    """Each turn of a Codex fixture as the fake plays it (host waits counted as zero). Pure."""
    at = {int(i): float(ms) for ms, _, i in (row.split("\t") for row in timing.splitlines() if row.strip())}
    turns: list[TurnTiming] = []
    start = waited = prompt_at = 0.0
    first: float | None = None
    lines = tools = prompts = 0
    in_turn = False
    for index, raw in enumerate(jsonl.splitlines()):
        host = raw.startswith(HOST)
        obj = json.loads(raw[len(HOST) :] if host else raw)
        when = at.get(index, 0.0)
        method = obj.get("method")
        if host and method == "turn/start":
            start, waited, first, lines, tools, prompts, in_turn = when, 0.0, None, 0, 0, 0, True
        elif host and "result" in obj and in_turn:
            waited += when - prompt_at
        elif not host and in_turn:
            lines += 1
            if first is None and method == "item/agentMessage/delta":
                first = when - start - waited
            if method == "item/started" and obj["params"]["item"]["type"] == "commandExecution":
                tools += 1
            if method == "item/commandExecution/requestApproval":
                prompts += 1
                prompt_at = when
            if method == "turn/completed":
                turns.append(TurnTiming(when - start - waited, first, lines, tools, prompts))
                in_turn = False
    return turns


def is_codex(jsonl_path: Path) -> bool:
    return jsonl_path.name.startswith("codex-")


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    recording = RECORDING.read_text()
    return write_files(out_dir, TURNS_NAME, build_bench_turns(recording)) + write_files(
        out_dir, BURST_NAME, build_burst(recording)
    )


if __name__ == "__main__":
    for path in write():
        print(path.relative_to(REPO))
