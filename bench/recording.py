"""The recorded Claude Code 2.1.197 lines a benchmark fixture is assembled from. Pure.

``Recording.parse`` reads a combined transcript (``>>> `` host lines and CLI stdout lines);
``Templates.from_recording`` finds, by shape, one recorded line of each kind a turn needs
(``system/init``, ``status``, message and block starts and stops, text and tool-input
deltas, the ``Read`` and ``Edit`` tool calls with their results, the ``can_use_tool``
prompt and the host's answer, ``result``) and the recorded text pieces. A recording that
lacks one of them raises ``ValueError``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import attrs

Json = dict[str, Any]
HOST = ">>> "


@attrs.frozen
class Recording:
    """The recorded lines a fixture is assembled from, each found by its shape."""

    lines: tuple[tuple[bool, Json], ...]

    @classmethod
    def parse(cls, text: str) -> Recording:
        lines = []
        for raw in text.splitlines():
            if raw.strip():
                host = raw.startswith(HOST)
                lines.append((host, json.loads(raw[len(HOST) :] if host else raw)))
        return cls(tuple(lines))

    def find(self, predicate: Callable[[Json], bool], *, host: bool = False, nth: int = 0) -> Json:
        found = [obj for is_host, obj in self.lines if is_host == host and predicate(obj)]
        if len(found) <= nth:
            raise ValueError("the recording lacks a line the fixture needs")
        return copy.deepcopy(found[nth])

    def text_pieces(self) -> list[str]:
        """The recorded text deltas, except those that carry a piece of a path."""
        pieces = [
            obj["event"]["delta"]["text"]
            for is_host, obj in self.lines
            if not is_host
            and event_type(obj) == "content_block_delta"
            and delta_type(obj) == "text_delta"
        ]
        return [p for p in pieces if p.strip() and "/" not in p and "ork" not in p]


def event_type(obj: Json) -> str | None:
    event = obj.get("event")
    kind = (
        event.get("type") if obj.get("type") == "stream_event" and isinstance(event, dict) else None
    )
    return kind if isinstance(kind, str) else None


def delta_type(obj: Json) -> str | None:
    kind = obj["event"].get("delta", {}).get("type")
    return kind if isinstance(kind, str) else None


def block_type(obj: Json) -> str | None:
    kind = obj["event"].get("content_block", {}).get("type")
    return kind if isinstance(kind, str) else None


def _tool_named(name: str) -> Callable[[Json], bool]:
    def match(obj: Json) -> bool:
        return (
            event_type(obj) == "content_block_start"
            and obj["event"]["content_block"].get("name") == name
        )

    return match


@attrs.frozen
class Templates:
    init_request: Json
    init_response: Json
    user: Json
    system_init: Json
    status: Json
    message_start: Json
    text_start: Json
    text_delta: Json
    assistant_text: Json
    block_stop: Json
    read_start: Json
    read_deltas: tuple[Json, ...]
    read_assistant: Json
    read_result: Json
    edit_start: Json
    edit_deltas: tuple[Json, ...]
    edit_assistant: Json
    edit_prompt: Json
    edit_answer: Json
    edit_result: Json
    tool_stop_delta: Json
    end_turn_delta: Json
    message_stop: Json
    result: Json
    pieces: tuple[str, ...]

    @classmethod
    def from_recording(cls, rec: Recording) -> Templates:
        def is_type(kind: str, subtype: str | None = None) -> Callable[[Json], bool]:
            return lambda o: (
                o.get("type") == kind and (subtype is None or o.get("subtype") == subtype)
            )

        def assistant_with(kind: str, name: str | None = None) -> Callable[[Json], bool]:
            def match(o: Json) -> bool:
                content = o.get("message", {}).get("content") or [{}]
                return (
                    o.get("type") == "assistant"
                    and content[0].get("type") == kind
                    and (name is None or content[0].get("name") == name)
                )

            return match

        def input_deltas(tool: str) -> tuple[Json, ...]:
            out: list[Json] = []
            inside = False
            for is_host, obj in rec.lines:
                if is_host:
                    continue
                if _tool_named(tool)(obj):
                    inside = True
                elif inside and event_type(obj) == "content_block_delta":
                    out.append(copy.deepcopy(obj))
                elif inside and out:
                    break
            return tuple(out)

        def tool_result(tool_use_id: str) -> Callable[[Json], bool]:
            def match(o: Json) -> bool:
                content = o.get("message", {}).get("content")
                return (
                    o.get("type") == "user"
                    and isinstance(content, list)
                    and content[0].get("tool_use_id") == tool_use_id
                )

            return match

        read_start = rec.find(_tool_named("Read"))
        edit_start = rec.find(_tool_named("Edit"))
        read_id = read_start["event"]["content_block"]["id"]
        edit_id = edit_start["event"]["content_block"]["id"]

        def stopdelta_type(reason: str) -> Callable[[Json], bool]:
            return lambda o: (
                event_type(o) == "message_delta"
                and o["event"]["delta"].get("stop_reason") == reason
            )

        return cls(
            init_request=rec.find(
                lambda o: o.get("request", {}).get("subtype") == "initialize", host=True
            ),
            init_response=rec.find(
                lambda o: (
                    o.get("type") == "control_response"
                    and "commands" in (o["response"].get("response") or {})
                )
            ),
            user=rec.find(is_type("user"), host=True),
            system_init=rec.find(is_type("system", "init"), nth=1),
            status=rec.find(is_type("system", "status")),
            message_start=rec.find(lambda o: event_type(o) == "message_start"),
            text_start=rec.find(
                lambda o: event_type(o) == "content_block_start" and block_type(o) == "text"
            ),
            text_delta=rec.find(
                lambda o: event_type(o) == "content_block_delta" and delta_type(o) == "text_delta"
            ),
            assistant_text=rec.find(assistant_with("text")),
            block_stop=rec.find(lambda o: event_type(o) == "content_block_stop"),
            read_start=read_start,
            read_deltas=input_deltas("Read"),
            read_assistant=rec.find(assistant_with("tool_use", "Read")),
            read_result=rec.find(tool_result(read_id)),
            edit_start=edit_start,
            edit_deltas=input_deltas("Edit"),
            edit_assistant=rec.find(assistant_with("tool_use", "Edit")),
            edit_prompt=rec.find(lambda o: o.get("request", {}).get("tool_name") == "Edit"),
            edit_answer=rec.find(lambda o: o.get("type") == "control_response", host=True),
            edit_result=rec.find(tool_result(edit_id)),
            tool_stop_delta=rec.find(stopdelta_type("tool_use")),
            end_turn_delta=rec.find(stopdelta_type("end_turn")),
            message_stop=rec.find(lambda o: event_type(o) == "message_stop"),
            result=rec.find(lambda o: o.get("type") == "result" and o.get("subtype") == "success"),
            pieces=tuple(rec.text_pieces()),
        )
