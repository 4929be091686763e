"""Record the real Claude Code CLI against the scripted mock model (mock_anthropic.py).

Job: run one recording the way ``shared/providers/fixtures`` were made: the real CLI in its
SDK-style stream-json mode, in a scratch workspace (``notes.txt`` = ``hello``) with a scratch
HOME, pointed at the mock; write user turns, answer permission prompts by ``--policy``, steer
a message into a running turn if asked, and keep reading after each ``result`` for output the
CLI writes on its own (background task wakes). Writes ``<name>.jsonl`` (stdout lines, and the
host's lines prefixed ``>>> ``), ``.stdout.jsonl``, ``.timing.tsv``, ``.meta.json`` and
``.stderr.txt``, with the workspace path rewritten to ``/workspace`` and HOME to ``/home/user``.

Example::

    python -m replay_fixtures.record.record_claude --claude .ci/node/node_modules/.bin/claude \\
        --name claude-2.1.197_subagent --turn "Use a SUBAGENT to read notes.txt" --out replay_fixtures/claude

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Any

from replay_fixtures.record import mock_anthropic

ARGV = [
    "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
    "--include-partial-messages", "--permission-prompt-tool", "stdio", "--permission-mode", "default",
]  # fmt: skip


class Recorder:
    def __init__(self, proc: subprocess.Popen[bytes], started: float) -> None:
        self.proc = proc
        self.started = started
        self.lines: list[tuple[float, str, str]] = []  # (ms, "in"|"out", text)
        self._buffer = b""
        self.eof = False

    def ms(self) -> float:
        return round((time.monotonic() - self.started) * 1000, 1)

    def write(self, obj: dict[str, Any]) -> None:
        text = json.dumps(obj, separators=(",", ":"))
        self.lines.append((self.ms(), "in", text))
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float) -> list[dict[str, Any]]:
        """Lines that arrive within ``timeout`` seconds (at least one wait)."""
        assert self.proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                self.eof = True
                break
            self._buffer += chunk
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                text = raw.decode()
                self.lines.append((self.ms(), "out", text))
                try:
                    got.append(json.loads(text))
                except ValueError:
                    got.append({"type": "?", "raw": text})
            if got and got[-1].get("type") in ("result", "control_request"):
                break
        selector.close()
        return got


def _user(text: str) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": text}, "session_id": "", "parent_tool_use_id": None}


def _answer(request: dict[str, Any], policy: dict[str, str]) -> dict[str, Any]:
    ask = request["request"]
    if policy.get(ask.get("tool_name", ""), "allow") == "allow":
        response: dict[str, Any] = {"behavior": "allow", "updatedInput": ask.get("input", {})}
    else:
        response = {"behavior": "deny", "message": "Denied by the recording driver (policy)."}
    return {"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"], "response": response}}


def record(args: argparse.Namespace) -> None:
    work = tempfile.mkdtemp(prefix="t3d-rec-work-")
    home = tempfile.mkdtemp(prefix="t3d-rec-home-")
    with open(os.path.join(work, "notes.txt"), "w") as f:
        f.write("hello\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = os.path.join(args.out, args.name + ".requests.log") if args.keep_requests else None
    server = mock_anthropic.serve(port, work, delay=args.delay, log_path=log_path)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "sk-ant-mock-not-a-real-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    }  # fmt: skip
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"
    env.update(item.split("=", 1) for item in args.env)
    for name in args.unset:
        env.pop(name, None)
    policy = dict(item.split("=", 1) for item in args.policy)
    started = time.monotonic()
    proc = subprocess.Popen([args.claude, *ARGV], cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rec = Recorder(proc, started)
    rec.write({"type": "control_request", "request_id": "req_init_" + uuid.uuid4().hex[:8], "request": {"subtype": "initialize"}})
    rec.read(10)
    steer = args.steer.split(":", 2) if args.steer else None  # turn index : deltas : text
    interrupt = [int(n) for n in args.interrupt.split(":", 1)] if args.interrupt else None  # turn : deltas
    for index, prompt in enumerate(args.turn):
        rec.write(_user(prompt))
        deltas, results, quiet_since = 0, 0, None
        turn_deadline = time.monotonic() + args.max_seconds
        while not rec.eof and time.monotonic() < turn_deadline:
            got = rec.read(0.5)
            for line in got:
                if line.get("type") == "control_request" and line.get("request", {}).get("subtype") == "can_use_tool":
                    rec.write(_answer(line, policy))
                if line.get("type") == "stream_event" and line.get("event", {}).get("type") == "content_block_delta":
                    deltas += 1
                    if steer and int(steer[0]) == index and deltas == int(steer[1]):
                        rec.write(_user(steer[2]))
                    if interrupt and interrupt == [index, deltas]:
                        rec.write({"type": "control_request", "request_id": "req_int_" + uuid.uuid4().hex[:8], "request": {"subtype": "interrupt"}})
                if line.get("type") == "result":
                    results += 1
            if got:
                quiet_since = None
            elif results >= 1:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= args.settle:
                    break
        time.sleep(0.3)
    assert proc.stdin is not None
    proc.stdin.close()
    while not rec.eof:
        rec.read(1.0)
        if time.monotonic() - started > args.max_seconds:
            proc.kill()
            break
    code = proc.wait(timeout=30)
    elapsed = rec.ms()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    server.shutdown()
    _write(args, rec, code, elapsed, stderr, work, home, policy)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)


def _scrub(text: str, work: str, home: str) -> str:
    encoded = re.sub(r"[^A-Za-z0-9]", "-", work)  # how the CLI names a project's directory
    return text.replace(work, "/workspace").replace(encoded, "-workspace").replace(home, "/home/user")


def _write(args: argparse.Namespace, rec: Recorder, code: int, elapsed: float, stderr: str, work: str, home: str, policy: dict[str, str]) -> None:
    stem = os.path.join(args.out, args.name)
    combined, stdout, timing = [], [], []
    for i, (ms, direction, text) in enumerate(rec.lines):
        text = _scrub(text, work, home)
        combined.append((">>> " if direction == "in" else "") + text)
        if direction == "out":
            stdout.append(text)
        timing.append(f"{ms}\t{direction}\t{i}")
    for suffix, rows in ((".jsonl", combined), (".stdout.jsonl", stdout), (".timing.tsv", timing)):
        with open(stem + suffix, "w") as f:
            f.write("\n".join(rows) + "\n")
    with open(stem + ".stderr.txt", "w") as f:
        f.write(_scrub(stderr, work, home))
    meta = {
        "argv": ["claude", *ARGV], "turns": args.turn, "exit_code": code, "elapsed_ms": elapsed,
        "policy": policy, "stdout_lines": len(stdout), "eof_seen": rec.eof,
        "steer": args.steer, "interrupt": args.interrupt, "env": args.env, "notes": args.notes,
    }  # fmt: skip
    with open(stem + ".meta.json", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claude", required=True, help="the real claude binary")
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--turn", action="append", required=True, help="a user prompt (repeat for more turns)")
    parser.add_argument("--policy", action="append", default=[], help="TOOL=allow|deny (default allow)")
    parser.add_argument("--steer", help="TURN:DELTAS:TEXT: write TEXT as a user message after DELTAS text deltas of turn TURN (0-based)")
    parser.add_argument("--interrupt", help="TURN:DELTAS: interrupt turn TURN (0-based) after DELTAS text deltas")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds of silence after a result before the next turn")
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--max-seconds", type=float, default=180)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the CLI's environment")
    parser.add_argument("--unset", action="append", default=[], help="drop NAME from the CLI's environment")
    parser.add_argument("--keep-requests", action="store_true", help="also write what the CLI sent to the mock")
    parser.add_argument("--notes", default="", help="a sentence for the meta file")
    record(parser.parse_args())


if __name__ == "__main__":
    main()
