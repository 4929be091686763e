"""The benchmark's replay fixtures, built from the recorded Claude Code 2.1.197 lines.

Theory of operation: every line of a built fixture is a line of the recording
``claude-2.1.197_multiturn_tools`` (the copy bundled in ``replay_fixtures/claude``, equal to
``../shared/providers/fixtures/claude``) with only its ids, its text pieces and its timing
changed. A turn is assembled from the recorded segments: ``system/init`` and ``status``, an
assistant message with a streamed text block and a ``Read`` tool call (auto-allowed) or an
``Edit`` tool call (asked for with ``can_use_tool``, answered by a host ``control_response``),
the recorded tool result, and a final streamed text message with ``result``. The recorded
shapes are kept; the recorded timing is stretched to the benchmark's: a turn lasts about 6 s,
its first streamed text arrives about 1.7 s in, it has 150-300 stream lines and 1-3 tool
calls, and one turn in five asks for permission.

Rules:

* Pure and deterministic: ``build_*`` functions take the recording's lines and return the
  fixture's files as text; the same inputs always give the same bytes (ids come from a
  seeded generator).
* The host's answer to a permission prompt is recorded at the prompt's own time, so the
  fixture's own turn duration never includes the approval wait (the fake times what follows
  from the moment the answer really arrives).
* ``python -m bench.fixture`` writes ``replay_fixtures/bench/``; ``tests/test_bench.py``
  checks that the files there are what the builder makes and that the fake CLI replays
  them through the real daemon.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs

from bench.recording import HOST, Json, Recording, Templates, block_type, delta_type, event_type

REPO = Path(__file__).resolve().parent.parent
RECORDING = REPO / "replay_fixtures" / "claude" / "claude-2.1.197_multiturn_tools.jsonl"
OUT_DIR = REPO / "replay_fixtures" / "bench"
TURNS_NAME = "claude-2.1.197_bench_turns"
BURST_NAME = "claude-2.1.197_bench_burst"


@attrs.frozen
class TurnPlan:
    """One fixture turn: its tool calls, whether one of them asks, its size and timing."""

    tools: int  # 1-3
    prompt: bool  # the first tool call is an Edit that asks for permission
    lines: int  # stdout lines of the turn, 150-300
    duration_ms: int  # user message to ``result``
    first_item_ms: int = 1700  # user message to the first text delta


# Five turns, replayed in a loop: 1+2+2+3+1 tool calls, a prompt in one turn of five.
BENCH_TURNS: tuple[TurnPlan, ...] = (
    TurnPlan(tools=1, prompt=False, lines=172, duration_ms=5900),
    TurnPlan(tools=2, prompt=False, lines=228, duration_ms=6100),
    TurnPlan(tools=2, prompt=True, lines=262, duration_ms=6000),
    TurnPlan(tools=3, prompt=False, lines=294, duration_ms=6200),
    TurnPlan(tools=1, prompt=False, lines=156, duration_ms=5800),
)
BURST_DELTAS = 5
BURST_DELTA_GAP_MS = 20

# Fixed gaps (ms) between structural lines; the text deltas share what is left of the turn.
INIT_MS = 8  # user message -> system/init (recorded: 7 ms)
MESSAGE_START_BEFORE_FIRST_ITEM_MS = 50  # message_start -> first text delta
MODEL_LATENCY_MS = 350  # tool result -> next message_start
TOOL_RUN_MS = 40  # message_stop (or the permission answer) -> tool result
STRUCTURAL_MS = 2  # block start/stop, assistant, message_delta, ...


# --- assembling turns ------------------------------------------------------------------


@attrs.define
class _Ids:
    """Fresh, deterministic ids in the recording's formats."""

    rng: random.Random

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def hex(self, n: int) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"


# A line to write: (host?, object, gap kind). Gap kinds: "stream" lines share the turn's
# free time evenly; the others get the fixed gaps above.
Planned = tuple[bool, Json, str]


class _TurnWriter:
    def __init__(self, t: Templates, ids: _Ids, pieces: Iterator[str]) -> None:
        self.t = t
        self.ids = ids
        self.pieces = pieces
        self.out: list[Planned] = []

    def emit(self, obj: Json, gap: str, *, host: bool = False) -> None:
        if "uuid" in obj:
            obj["uuid"] = self.ids.uuid()
        self.out.append((host, obj, gap))

    def textblock_type(self, message_id: str, index: int, deltas: int, first_gap: str) -> str:
        start = copy.deepcopy(self.t.text_start)
        start["event"]["index"] = index
        self.emit(start, "fixed")
        text = ""
        for n in range(deltas):
            piece = next(self.pieces)
            delta = copy.deepcopy(self.t.text_delta)
            delta["event"]["index"] = index
            delta["event"]["delta"]["text"] = piece
            self.emit(delta, first_gap if n == 0 else "stream")
            text += piece
        assistant = copy.deepcopy(self.t.assistant_text)
        assistant["message"]["id"] = message_id
        assistant["message"]["content"][0]["text"] = text
        assistant["request_id"] = "req_mock_" + self.ids.hex(20)
        self.emit(assistant, "fixed")
        stop = copy.deepcopy(self.t.block_stop)
        stop["event"]["index"] = index
        self.emit(stop, "fixed")
        return text

    def message_start(self, gap: str) -> str:
        start = copy.deepcopy(self.t.message_start)
        message_id = "msg_mock_" + self.ids.hex(20)
        start["event"]["message"]["id"] = message_id
        self.emit(start, gap)
        return message_id

    def tool_message(self, deltas: int, *, edit: bool, first: bool) -> None:
        t = self.t
        message_id = self.message_start("message_start" if first else "model")
        self.textblock_type(message_id, 0, deltas, "first_item" if first else "stream")
        tool_id = "toolu_mock_" + self.ids.hex(16)
        start = copy.deepcopy(t.edit_start if edit else t.read_start)
        start["event"]["index"] = 1
        start["event"]["content_block"]["id"] = tool_id
        self.emit(start, "fixed")
        for recorded in t.edit_deltas if edit else t.read_deltas:
            delta = copy.deepcopy(recorded)
            delta["event"]["index"] = 1
            self.emit(delta, "stream")
        assistant = copy.deepcopy(t.edit_assistant if edit else t.read_assistant)
        assistant["message"]["id"] = message_id
        assistant["message"]["content"][0]["id"] = tool_id
        assistant["request_id"] = "req_mock_" + self.ids.hex(20)
        self.emit(assistant, "fixed")
        stop = copy.deepcopy(t.block_stop)
        stop["event"]["index"] = 1
        self.emit(stop, "fixed")
        self.emit(copy.deepcopy(t.tool_stop_delta), "fixed")
        self.emit(copy.deepcopy(t.message_stop), "fixed")
        if edit:
            request_id = self.ids.uuid()
            prompt = copy.deepcopy(t.edit_prompt)
            prompt["request_id"] = request_id
            prompt["request"]["tool_use_id"] = tool_id
            self.emit(prompt, "fixed")
            answer = copy.deepcopy(t.edit_answer)
            answer["response"]["request_id"] = request_id
            self.emit(answer, "same", host=True)
        result = copy.deepcopy(t.edit_result if edit else t.read_result)
        result["message"]["content"][0]["tool_use_id"] = tool_id
        self.emit(result, "tool")
        self.emit(copy.deepcopy(t.status), "fixed")

    def final_message(self, deltas: int) -> str:
        message_id = self.message_start("model")
        text = self.textblock_type(message_id, 0, deltas, "stream")
        self.emit(copy.deepcopy(self.t.end_turn_delta), "fixed")
        self.emit(copy.deepcopy(self.t.message_stop), "fixed")
        return text


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """``total`` split into ``parts`` positive shares of roughly equal size."""
    weights = [rng.uniform(0.7, 1.3) for _ in range(parts)]
    shares = [max(2, int(total * w / sum(weights))) for w in weights]
    shares[-1] += total - sum(shares)
    return shares


def _overhead_lines(plan: TurnPlan, t: Templates) -> int:
    """Stdout lines of a turn that are not text deltas (for a target line count)."""
    per_tool = (
        4 + 7 + len(t.read_deltas)
    )  # message_start, text start/assistant/stop; tool start, assistant, stop, message_delta/stop, result, status
    edit_extra = (len(t.edit_deltas) - len(t.read_deltas)) + 1 if plan.prompt else 0
    return 2 + plan.tools * per_tool + edit_extra + 6 + 1  # init+status; final message; result


def plan_turn(
    plan: TurnPlan, t: Templates, ids: _Ids, pieces: Iterator[str], *, first_turn: bool
) -> list[tuple[bool, Json, int]]:
    """One turn's lines with their times (ms after the user message)."""
    w = _TurnWriter(t, ids, pieces)
    user = copy.deepcopy(t.user)
    user["session_id"] = "" if first_turn else t.system_init["session_id"]
    w.emit(user, "start", host=True)
    w.emit(copy.deepcopy(t.system_init), "init")
    w.emit(copy.deepcopy(t.status), "fixed")
    deltas = _split(plan.lines - _overhead_lines(plan, t), plan.tools + 1, ids.rng)
    for n in range(plan.tools):
        w.tool_message(deltas[n], edit=plan.prompt and n == 0, first=n == 0)
    text = w.final_message(deltas[-1])
    result = copy.deepcopy(t.result)
    result.update(
        duration_ms=plan.duration_ms,
        num_turns=plan.tools + 1,
        result=text,
        session_id=t.system_init["session_id"],
    )
    w.emit(result, "fixed")
    return _schedule(w.out, plan)


def _schedule(
    planned: list[Planned], plan: TurnPlan, gaps: dict[str, int] | None = None
) -> list[tuple[bool, Json, int]]:
    """The lines' times: fixed gaps by kind (``gaps``: more kinds), the text deltas sharing
    what is left of ``plan.duration_ms``."""
    fixed = {
        **(gaps or {}),
        "start": 0,
        "same": 0,
        "fixed": STRUCTURAL_MS,
        "model": MODEL_LATENCY_MS,
        "tool": TOOL_RUN_MS,
        "init": INIT_MS,
    }
    after_first = [
        gap for _, _, gap in planned[[g for _, _, g in planned].index("first_item") + 1 :]
    ]
    fixed_after = sum(fixed.get(g, 0) for g in after_first)
    streams = after_first.count("stream")
    unit = (plan.duration_ms - plan.first_item_ms - fixed_after) / streams
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


# --- the files -------------------------------------------------------------------------


@attrs.frozen
class FixtureFiles:
    jsonl: str
    timing: str
    meta: str


def _dump(obj: Json) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _files(t: Templates, turns: list[list[tuple[bool, Json, int]]], meta: Json) -> FixtureFiles:
    lines = [HOST + _dump(t.init_request), _dump(t.init_response)]
    timing = ["0\tin\t0", "5\tout\t1"]
    base = 10
    for turn in turns:
        for host, obj, at in turn:
            timing.append(f"{base + at}\t{'in' if host else 'out'}\t{len(lines)}")
            lines.append((HOST if host else "") + _dump(obj))
        base += turn[-1][2] + 300  # the host's next message, 0.3 s later (as recorded)
    return FixtureFiles(
        "\n".join(lines) + "\n", "\n".join(timing) + "\n", json.dumps(meta, indent=1) + "\n"
    )


def _argv() -> list[str]:
    return ["claude", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
            "--include-partial-messages", "--permission-prompt-tool", "stdio", "--permission-mode", "default"]  # fmt: skip


def build_bench_turns(
    recording: str, plans: tuple[TurnPlan, ...] = BENCH_TURNS, seed: int = 3
) -> FixtureFiles:
    """The realistic fixture: ``plans`` as turns of recorded lines, retimed."""
    t = Templates.from_recording(Recording.parse(recording))
    ids = _Ids(random.Random(seed))
    pieces = _cycle(t.pieces)
    turns = [plan_turn(p, t, ids, pieces, first_turn=i == 0) for i, p in enumerate(plans)]
    meta = {
        "argv": _argv(),
        "turns": ["bench turn"] * len(plans),
        "exit_code": 0,
        "built_by": "python -m bench.fixture (bench/fixture.py) from claude-2.1.197_multiturn_tools",
        "plan": [attrs.asdict(p) for p in plans],
        "stdout_lines_per_turn": [sum(1 for host, _, _ in turn if not host) for turn in turns],
        "policy": {"Edit": "allow"},
    }
    return _files(t, turns, meta)


def build_burst(recording: str, seed: int = 5) -> FixtureFiles:
    """The burst fixture: one text answer streamed as 5 deltas 20 ms apart, no tools."""
    t = Templates.from_recording(Recording.parse(recording))
    ids = _Ids(random.Random(seed))
    w = _TurnWriter(t, ids, _cycle(t.pieces))
    user = copy.deepcopy(t.user)
    w.emit(user, "start", host=True)
    w.emit(copy.deepcopy(t.system_init), "init")
    w.emit(copy.deepcopy(t.status), "fixed")
    message_id = w.message_start("fixed")
    text = w.textblock_type(message_id, 0, BURST_DELTAS, "stream")
    w.emit(copy.deepcopy(t.end_turn_delta), "fixed")
    w.emit(copy.deepcopy(t.message_stop), "fixed")
    result = copy.deepcopy(t.result)
    result.update(num_turns=1, result=text, duration_ms=INIT_MS + BURST_DELTAS * BURST_DELTA_GAP_MS)
    w.emit(result, "fixed")
    fixed = {"start": 0, "init": INIT_MS, "fixed": 1, "stream": BURST_DELTA_GAP_MS}
    now, timed = 0, []
    for host, obj, gap in w.out:
        now += fixed[gap]
        timed.append((host, obj, now))
    meta = {
        "argv": _argv(),
        "turns": ["burst"],
        "exit_code": 0,
        "built_by": "python -m bench.fixture (bench/fixture.py) from claude-2.1.197_multiturn_tools",
        "plan": {"text_deltas": BURST_DELTAS, "delta_gap_ms": BURST_DELTA_GAP_MS},
    }
    return _files(t, [timed], meta)


def _cycle(pieces: tuple[str, ...]) -> Iterator[str]:
    while True:
        yield from pieces


# --- reading a fixture back ------------------------------------------------------------


@attrs.frozen
class TurnTiming:
    duration_ms: float  # user message -> result, without host waits
    first_item_ms: float | None  # user message -> first text delta
    stdout_lines: int
    tool_calls: int
    prompts: int


def turn_timings(jsonl: str, timing: str) -> list[TurnTiming]:
    """Each turn of a fixture as the fake CLI plays it (host waits counted as zero). Pure."""
    at = {
        int(i): float(ms)
        for ms, _, i in (row.split("\t") for row in timing.splitlines() if row.strip())
    }
    turns: list[TurnTiming] = []
    start = waited = 0.0
    first: float | None = None
    lines = tools = prompts = 0
    prompt_at = 0.0
    in_turn = False
    for index, raw in enumerate(jsonl.splitlines()):
        host = raw.startswith(HOST)
        obj = json.loads(raw[len(HOST) :] if host else raw)
        when = at.get(index, 0.0)
        if host and obj.get("type") == "user":
            start, waited, first, lines, tools, prompts, in_turn = when, 0.0, None, 0, 0, 0, True
        elif host and obj.get("type") == "control_response":
            waited += when - prompt_at
        elif not host and in_turn:
            lines += 1
            if (
                first is None
                and event_type(obj) == "content_block_delta"
                and delta_type(obj) == "text_delta"
            ):
                first = when - start - waited
            if event_type(obj) == "content_block_start" and block_type(obj) == "tool_use":
                tools += 1
            if obj.get("type") == "control_request":
                prompts += 1
                prompt_at = when
            if obj.get("type") == "result":
                turns.append(TurnTiming(when - start - waited, first, lines, tools, prompts))
                in_turn = False
    return turns


def read_timings(jsonl_path: Path) -> list[TurnTiming]:
    """The turns of a fixture on disk (``X.jsonl`` with ``X.timing.tsv``), Claude's or Codex's."""
    from bench import codex_fixture  # it builds on this module

    stem = str(jsonl_path)[: -len(".jsonl")]
    read = codex_fixture.turn_timings if codex_fixture.is_codex(jsonl_path) else turn_timings
    return read(jsonl_path.read_text(), Path(stem + ".timing.tsv").read_text())


def mean_turn_s(jsonl_path: Path) -> float:
    """The fixture's own mean turn duration in seconds (read from its files)."""
    timings = read_timings(jsonl_path)
    return sum(t.duration_ms for t in timings) / len(timings) / 1000


def mean_lines_per_turn(jsonl_path: Path) -> float:
    """The fixture's mean stdout lines per turn (what the provider writes, read from its files)."""
    timings = read_timings(jsonl_path)
    return sum(t.stdout_lines for t in timings) / len(timings)


def fixture_path(name: str) -> Path:
    return OUT_DIR / f"{name}.jsonl"


def write_files(out_dir: Path, name: str, files: FixtureFiles) -> list[Path]:
    """Write a fixture's three files (``name`` + .jsonl, .timing.tsv, .meta.json)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, text in ((".jsonl", files.jsonl), (".timing.tsv", files.timing), (".meta.json", files.meta)):
        path = out_dir / (name + suffix)
        path.write_text(text)
        written.append(path)
    return written


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    recording = RECORDING.read_text()
    return write_files(out_dir, TURNS_NAME, build_bench_turns(recording)) + write_files(
        out_dir, BURST_NAME, build_burst(recording)
    )


if __name__ == "__main__":
    for path in write():
        print(path.relative_to(REPO))
