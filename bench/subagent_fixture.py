"""The benchmark's subagent fixture: the bench turns with two foreground subagents each.

Theory of operation: ``claude-2.1.197_bench_subagent_turns`` is ``bench/fixture.py``'s
fixture (the same five `TurnPlan`s, replayed in a loop) with two more model messages in
every turn, after the turn's own tool calls and before its final message. Each starts a
foreground subagent with an ``Agent`` tool call, assembled from the recording
``claude-2.1.197_subagent`` (Claude Code 2.1.197 against a mock model) with only its ids,
its text and its timing changed: the parent's streamed text and ``Agent`` call (its
``assistant`` line, ``task_started``), the subagent's ``user`` prompt line, ``task_progress``,
the subagent's own lines (``parent_tool_use_id``: an ``assistant`` line with a little text,
one with a ``Read`` call, the ``user`` line with its result), ``task_updated`` and
``task_notification``, then the parent's ``user`` line with the ``Agent`` call's result,
which ends the subagent. 2.1.197 streams no partial messages of a subagent, so its text is
one ``assistant`` line (the recorded subagent line with a text block for its tool call);
the two subagents run one after the other, as the recorded one did.

Compared with the plain fixture, turn for turn: the same stdout lines (156-294, 222 on
average; each subagent takes 20 of them, 11 of which are the subagent's or its ``task_*``
lines, and the turn's text deltas give them up: 92-200 deltas a turn against 132-240), the
same duration (5.8-6.2 s, 6.0 s on average: the parent's ``Agent`` message takes the usual
350 ms model gap, the subagent's own model calls 100 ms each as recorded, and the text
deltas stream a little faster, 9-25 ms apart against 13-27 ms), the first streamed text at
the same 1.7 s, the same own tool calls and prompt, plus two ``Agent`` calls (whose ``Read``
calls are the subagents').

Rules: pure and deterministic like `bench.fixture`; ``python -m bench.subagent_fixture``
writes it to ``replay_fixtures/bench/``; ``tests/test_bench_subagents.py`` checks that the
files there are what the builder makes and that a real daemon opens two child threads per
turn for it.
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
    OUT_DIR,
    RECORDING,
    REPO,
    FixtureFiles,
    TurnPlan,
    _argv,
    _cycle,
    _files,
    _Ids,
    _overhead_lines,
    _schedule,
    _split,
    _TurnWriter,
    write_files,
)
from bench.recording import Json, Recording, Templates, event_type

SUBAGENT_RECORDING = REPO / "replay_fixtures" / "claude" / "claude-2.1.197_subagent.jsonl"
SUBAGENTS_NAME = "claude-2.1.197_bench_subagent_turns"
SUBAGENTS_PER_TURN = 2
CHILD_TEXT_PIECES = 4  # text pieces of a subagent's own text
# A subagent's model calls (its text, its final answer), as recorded against the mock
# model (~100 ms; the parent's take `MODEL_LATENCY_MS`, 350 ms).
SUBAGENT_MODEL_MS = 100


@attrs.frozen
class SubagentTemplates:
    """The recorded lines of one foreground subagent, in the order the CLI wrote them."""

    agent_start: Json  # content_block_start of the parent's Agent call
    agent_deltas: tuple[Json, ...]  # its input_json_delta lines
    agent_assistant: Json  # the parent's assistant line with the Agent call
    task_started: Json
    prompt: Json  # the subagent's user line: its prompt
    task_progress: Json
    child_tool: Json  # the subagent's assistant line with its Read call
    child_result: Json  # the subagent's user line with the Read result
    task_updated: Json
    task_notification: Json
    agent_result: Json  # the parent's user line with the Agent call's result
    ids: dict[str, str]  # what each recorded id is (agent, task, tool, message, session)

    @classmethod
    def from_recording(cls, rec: Recording) -> SubagentTemplates:
        start = rec.find(
            lambda o: event_type(o) == "content_block_start" and o["event"]["content_block"].get("name") == "Agent"
        )
        agent = start["event"]["content_block"]["id"]

        def system(subtype: str) -> Json:
            return rec.find(lambda o: o.get("type") == "system" and o.get("subtype") == subtype)

        def of_child(kind: str, part: str) -> Json:
            return rec.find(
                lambda o: o.get("type") == kind
                and o.get("parent_tool_use_id") == agent
                and o["message"]["content"][0].get("type") == part
            )

        def first_part(o: Json) -> Json:
            content = o.get("message", {}).get("content")
            return content[0] if isinstance(content, list) and content and isinstance(content[0], dict) else {}

        child_tool = of_child("assistant", "tool_use")
        task_started = system("task_started")
        return cls(
            agent_start=start,
            agent_deltas=_input_deltas(rec, start),
            agent_assistant=rec.find(lambda o: o.get("type") == "assistant" and first_part(o).get("id") == agent),
            task_started=task_started,
            prompt=of_child("user", "text"),
            task_progress=system("task_progress"),
            child_tool=child_tool,
            child_result=of_child("user", "tool_result"),
            task_updated=system("task_updated"),
            task_notification=system("task_notification"),
            agent_result=rec.find(lambda o: o.get("type") == "user" and first_part(o).get("tool_use_id") == agent),
            ids={
                "agent": agent,
                "task": task_started["task_id"],
                "tool": first_part(child_tool)["id"],
                "message": child_tool["message"]["id"],
                "session": task_started["session_id"],
            },
        )

    def rewritten(self, line: Json, new: dict[str, str]) -> Json:
        """``line`` with every recorded id replaced by its new one (``new``: by kind)."""
        text = json.dumps(line, ensure_ascii=False)
        for kind, old in self.ids.items():
            text = text.replace(old, new[kind])
        value: Json = json.loads(text)
        return value


def _input_deltas(rec: Recording, start: Json) -> tuple[Json, ...]:
    """The input deltas of the tool call ``start`` opens: the deltas after it, at its index."""
    lines = [obj for host, obj in rec.lines if not host]
    at = lines.index(start)
    out: list[Json] = []
    for obj in lines[at + 1 :]:
        if event_type(obj) != "content_block_delta" or obj["event"].get("index") != start["event"]["index"]:
            break
        out.append(obj)
    return tuple(out)


# Lines of one subagent's model message, besides its text deltas: message_start, text
# start/assistant/stop; Agent start, assistant, task_started, stop, the prompt,
# message_delta/stop, task_progress, the child's text, Read and result, task_updated,
# task_notification, the Agent result, status (plus the Agent input deltas).
AGENT_LINES = 4 + 15


class _SubagentTurnWriter(_TurnWriter):
    def agent_message(self, s: SubagentTemplates, deltas: int, session_id: str) -> None:
        """A model message that starts a foreground subagent, and the subagent's lines."""
        t = self.t
        message_id = self.message_start("model")
        self.textblock_type(message_id, 0, deltas, "stream")
        new = {
            "agent": "toolu_mock_" + self.ids.hex(16),
            "task": "a" + self.ids.hex(16),
            "tool": "toolu_mock_" + self.ids.hex(16),
            "message": "msg_mock_" + self.ids.hex(20),
            "session": session_id,
        }

        def line(template: Json, gap: str, index: int | None = None) -> None:
            obj = s.rewritten(template, new)
            if index is not None:
                obj["event"]["index"] = index
            if "request_id" in obj:
                obj["request_id"] = "req_mock_" + self.ids.hex(20)
            self.emit(obj, gap)

        line(s.agent_start, "fixed", 1)
        for delta in s.agent_deltas:
            line(delta, "stream", 1)
        assistant = s.rewritten(s.agent_assistant, new)
        assistant["message"]["id"] = message_id
        assistant["request_id"] = "req_mock_" + self.ids.hex(20)
        self.emit(assistant, "fixed")
        line(s.task_started, "fixed")
        stop = copy.deepcopy(t.block_stop)
        stop["event"]["index"] = 1
        self.emit(stop, "fixed")
        line(s.prompt, "fixed")
        self.emit(copy.deepcopy(t.tool_stop_delta), "fixed")
        self.emit(copy.deepcopy(t.message_stop), "fixed")
        line(s.task_progress, "fixed")
        text = s.rewritten(s.child_tool, new)
        text["message"]["content"] = [{"type": "text", "text": "".join(next(self.pieces) for _ in range(CHILD_TEXT_PIECES))}]
        self.emit(text, "subagent_model")
        line(s.child_tool, "fixed")
        line(s.child_result, "tool")
        line(s.task_updated, "subagent_model")  # after its final model call
        line(s.task_notification, "fixed")
        line(s.agent_result, "fixed")
        self.emit(copy.deepcopy(t.status), "fixed")


def plan_subagent_turn(
    plan: TurnPlan, t: Templates, s: SubagentTemplates, ids: _Ids, pieces: Iterator[str], *, first_turn: bool
) -> list[tuple[bool, Json, int]]:
    """One turn of ``plan`` with `SUBAGENTS_PER_TURN` subagents, in ``plan.lines`` lines."""
    w = _SubagentTurnWriter(t, ids, pieces)
    session_id = t.system_init["session_id"]
    user = copy.deepcopy(t.user)
    user["session_id"] = "" if first_turn else session_id
    w.emit(user, "start", host=True)
    w.emit(copy.deepcopy(t.system_init), "init")
    w.emit(copy.deepcopy(t.status), "fixed")
    overhead = _overhead_lines(plan, t) + SUBAGENTS_PER_TURN * (AGENT_LINES + len(s.agent_deltas))
    deltas = _split(plan.lines - overhead, plan.tools + SUBAGENTS_PER_TURN + 1, ids.rng)
    for n in range(plan.tools):
        w.tool_message(deltas[n], edit=plan.prompt and n == 0, first=n == 0)
    for n in range(SUBAGENTS_PER_TURN):
        w.agent_message(s, deltas[plan.tools + n], session_id)
    text = w.final_message(deltas[-1])
    result = copy.deepcopy(t.result)
    result.update(
        duration_ms=plan.duration_ms, num_turns=plan.tools + SUBAGENTS_PER_TURN + 1, result=text, session_id=session_id
    )
    w.emit(result, "fixed")
    return _schedule(w.out, plan, {"subagent_model": SUBAGENT_MODEL_MS})


def build_subagent_turns(
    recording: str, subagent_recording: str, plans: tuple[TurnPlan, ...] = BENCH_TURNS, seed: int = 7
) -> FixtureFiles:
    """The subagent fixture: ``plans`` as turns of recorded lines, two subagents in each."""
    t = Templates.from_recording(Recording.parse(recording))
    s = SubagentTemplates.from_recording(Recording.parse(subagent_recording))
    ids = _Ids(random.Random(seed))
    pieces = _cycle(t.pieces)
    turns = [plan_subagent_turn(p, t, s, ids, pieces, first_turn=i == 0) for i, p in enumerate(plans)]
    meta = {
        "argv": _argv(),
        "turns": ["bench turn with subagents"] * len(plans),
        "exit_code": 0,
        "built_by": "python -m bench.subagent_fixture (bench/subagent_fixture.py) from "
        "claude-2.1.197_multiturn_tools and claude-2.1.197_subagent",
        "plan": [attrs.asdict(p) for p in plans],
        "subagents_per_turn": SUBAGENTS_PER_TURN,
        "stdout_lines_per_turn": [sum(1 for host, _, _ in turn if not host) for turn in turns],
        "policy": {"Edit": "allow"},
    }
    return _files(t, turns, meta)


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    files = build_subagent_turns(RECORDING.read_text(), SUBAGENT_RECORDING.read_text())
    return write_files(out_dir, SUBAGENTS_NAME, files)


if __name__ == "__main__":
    for path in write():
        print(path.relative_to(REPO))
