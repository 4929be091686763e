"""A scripted stand-in for the Anthropic Messages API, for recording the real Claude Code CLI.

Job: answer ``POST /v1/messages`` with a streamed (SSE) reply chosen by keywords, so the real
CLI runs real tools, subagents, background tasks and permission prompts against a model
whose words are scripted. Nothing leaves the machine; the CLI's own lines are real.

Rules:

* The reply depends on the latest user *text* of the conversation (a new prompt, a subagent's
  prompt, or a task notification) and on how many tool results came after it: reply ``i`` of
  the matching script is sent after ``i`` tool results. Past the script's end: ``Done.``
* A subagent is an ordinary conversation whose first prompt is the parent's ``Agent`` prompt,
  so its keyword (``SUBTASK...``) picks its script the same way.
* ``APIERR401`` in the prompt gets an HTTP 401 authentication error, as the real API sends.
* Every request is logged as one JSON line to ``--log`` (for finding out what the CLI sends).
* Standard library only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import threading
import time
import uuid
from typing import Any

Block = tuple[str, Any]  # ("text", str) | ("tool_use", (name, input))

NOTES = "notes.txt"


def _text(value: str) -> Block:
    return ("text", value)


def _tool(name: str, **tool_input: Any) -> Block:
    return ("tool_use", (name, tool_input))


def _agent(prompt: str, description: str, *, background: bool = False) -> Block:
    args: dict[str, Any] = {"description": description, "prompt": prompt, "subagent_type": "general-purpose"}
    if background:
        args["run_in_background"] = True
    return _tool("Agent", **args)


# keyword -> the replies of one turn, in order (reply i after i tool results)
SCRIPTS: dict[str, list[list[Block]]] = {
    # a subagent that reads a file and reports
    "SUBAGENT": [
        [_text("I'll ask a subagent to read the notes."), _agent("SUBTASK-READ: read notes.txt and report its first line", "Read the notes")],
        [_text("The subagent reported back: the notes say hello.")],
    ],
    "SUBTASK-READ": [
        [_text("Reading the file."), _tool("Read", file_path="@CWD@/" + NOTES)],
        [_text("The first line of notes.txt is: hello")],
    ],
    # a subagent that starts a subagent of its own
    "NESTED": [
        [_text("I'll delegate this to a subagent."), _agent("SUBTASK-NEST: delegate reading notes.txt to another agent", "Delegate the reading")],
        [_text("The nested subagents finished: the notes say hello.")],
    ],
    "SUBTASK-NEST": [
        [_text("I'll start another agent for it."), _agent("SUBTASK-READ: read notes.txt and report its first line", "Read the notes")],
        [_text("The inner agent says the first line is hello.")],
    ],
    # a subagent whose edit asks for permission
    "SUBPERM": [
        [_text("A subagent will edit the notes."), _agent("SUBTASK-EDIT: change hello to hello, world in notes.txt", "Edit the notes")],
        [_text("The subagent finished its edit.")],
    ],
    "SUBTASK-EDIT": [
        [_text("Reading the file first."), _tool("Read", file_path="@CWD@/" + NOTES)],
        [_text("Now editing it."), _tool("Edit", file_path="@CWD@/" + NOTES, old_string="hello", new_string="hello, world")],
        [_text("Edited notes.txt.")],
    ],
    # a background Bash command; the CLI wakes the agent when it finishes
    "BGBASH": [
        [_text("I'll run that in the background."), _tool("Bash", command="sleep 2; echo bg-done", description="Wait, then print bg-done", run_in_background=True)],
        [_text("It is running in the background; I'll report when it finishes.")],
    ],
    # a background subagent that reports later
    "BGAGENT": [
        [_text("I'll start a background agent."), _agent("SUBTASK-SLOW: wait a moment, then report", "Slow background check", background=True)],
        [_text("The background agent is running; I'll report when it is done.")],
    ],
    "SUBTASK-SLOW": [
        [_text("Waiting a moment."), _tool("Bash", command="sleep 3; echo slow-done", description="Wait three seconds")],
        [_text("The slow check is done: slow-done")],
    ],
    # a long background subagent, stopped by a later turn, then continued by another
    "BGLONG": [
        [_text("I'll start a long background agent."), _agent("SUBTASK-LONG: watch for a while, then report", "Long background watch", background=True)],
        [_text("The long agent is running in the background.")],
    ],
    "SUBTASK-LONG": [
        [_text("Watching."), _tool("Bash", command="sleep 20; echo long-done", description="Watch for twenty seconds")],
        [_text("The watch is over: long-done")],
    ],
    "STOPIT": [
        [_text("Stopping the background agent."), _tool("TaskStop", task_id="@AGENT_ID@")],
        [_text("I stopped the background agent.")],
    ],
    "RESUMEIT": [
        [_text("I'll ask the agent to continue."), _tool("SendMessage", to="@AGENT_ID@", summary="Continue the watch briefly", message="SUBTASK-RESUMED: report right away")],
        [_text("I asked the agent to continue; it will report back.")],
    ],
    "SUBTASK-RESUMED": [
        [_text("Resumed: nothing more to watch.")],
    ],
    # a background command whose wake starts another background command
    "BGCHAIN": [
        [_text("First background step."), _tool("Bash", command="sleep 1; echo one", description="CHAIN-ONE first step", run_in_background=True)],
        [_text("Step one runs in the background.")],
    ],
    # slow text, for steering a message into a running turn
    "STEER": [
        [_text("\n".join(str(i) for i in range(1, 61)))],
    ],
}
NOTIFICATION_REPLY = "A background task finished: {summary}"
# A task notification whose summary names one of these gets this reply instead of the default.
NOTIFICATION_SCRIPTS: dict[str, list[list[Block]]] = {
    "CHAIN-ONE": [
        [_text("Step one is done; starting step two."), _tool("Bash", command="sleep 1; echo two", description="CHAIN-TWO second step", run_in_background=True)],
        [_text("Step two runs in the background.")],
    ],
    "CHAIN-TWO": [[_text("Both background steps finished.")]],
}
AGENT_ID = re.compile(r"agentId: (\w+)")
FALLBACK = [[_text("ok")]]
DONE = [_text("Done.")]
KEYWORD = re.compile(r"\b(SUBTASK-[A-Z]+|[A-Z]{4,}[A-Z0-9]*)\b")


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]


def _is_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def choose_reply(messages: list[dict[str, Any]], cwd: str) -> list[Block] | int:
    """The blocks to answer with, or an HTTP status to fail with. Pure."""
    prompt_at = max((i for i, m in enumerate(messages) if m.get("role") == "user" and not _is_tool_result(m)), default=0)
    prompt = "\n".join(_texts(messages[prompt_at].get("content", ""))) if messages else ""
    results = sum(1 for m in messages[prompt_at + 1 :] if m.get("role") == "user" and _is_tool_result(m))
    if "APIERR401" in prompt:
        return 401
    script = FALLBACK
    if "<task-notification>" in prompt:
        match = re.search(r"<summary>(.*?)</summary>", prompt, re.S)
        summary = match.group(1).strip() if match else "see its output"
        named = [word for word in NOTIFICATION_SCRIPTS if word in summary]
        script = NOTIFICATION_SCRIPTS[named[0]] if named else [[_text(NOTIFICATION_REPLY.format(summary=summary))]]
    else:
        for word in KEYWORD.findall(prompt):
            if word in SCRIPTS:
                script = SCRIPTS[word]
                break
    reply = script[results] if results < len(script) else DONE
    agent_ids = AGENT_ID.findall(json.dumps(messages))
    fill = {"@CWD@": cwd, "@AGENT_ID@": agent_ids[-1] if agent_ids else "unknown"}
    return [(kind, _filled(value, fill)) for kind, value in reply]


def _filled(value: Any, fill: dict[str, str]) -> Any:
    text = json.dumps(value)
    for placeholder, real in fill.items():
        text = text.replace(placeholder, real)
    return json.loads(text)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.log(self.path, body)
        reply = choose_reply(body.get("messages") or [], self.server.cwd)
        if isinstance(reply, int):
            error = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
            data = json.dumps(error).encode()
            self.send_response(reply)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        self._stream(body.get("model") or "claude-mock", reply)
        self.close_connection = True

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(self, model: str, blocks: list[Block]) -> None:
        delay = self.server.delay
        message_id = "msg_mock_" + uuid.uuid4().hex[:20]
        usage = {"input_tokens": 321, "output_tokens": 1}
        start: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
        self._event("message_start", {"type": "message_start", "message": start})
        stop = "end_turn"
        for index, (kind, value) in enumerate(blocks):
            if kind == "text":
                self._event("content_block_start", {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
                for piece in re.findall(r"\S+\s*|\s+", value):
                    time.sleep(delay)
                    self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})
            else:
                name, tool_input = value
                stop = "tool_use"
                tool_id = "toolu_mock_" + uuid.uuid4().hex[:16]
                block = {"type": "tool_use", "id": tool_id, "name": name, "input": {}}
                self._event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
                time.sleep(delay)
                self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}})  # fmt: skip
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
        self._event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 20}})
        self._event("message_stop", {"type": "message_stop"})


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], cwd: str, delay: float, log_path: str | None) -> None:
        super().__init__(address, _Handler)
        self.cwd = cwd
        self.delay = delay
        self._log = open(log_path, "a") if log_path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def log(self, path: str, body: dict[str, Any]) -> None:
        if self._log is not None:
            with self._lock:
                self._log.write(json.dumps({"at": time.time(), "path": path, "body": body}) + "\n")
                self._log.flush()


def serve(port: int, cwd: str, *, delay: float = 0.02, log_path: str | None = None) -> _Server:
    """Start the mock on 127.0.0.1:port in a thread; return the server (``shutdown()`` stops it)."""
    server = _Server(("127.0.0.1", port), cwd, delay, log_path)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--cwd", required=True, help="the CLI's working directory (for tool paths)")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between streamed pieces")
    parser.add_argument("--log", help="append every request to this file")
    args = parser.parse_args()
    server = serve(args.port, args.cwd, delay=args.delay, log_path=args.log)
    threading.Event().wait()
    server.shutdown()


if __name__ == "__main__":
    main()
