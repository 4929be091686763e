"""Tests for the fake `codex` CLI (replay_fixtures/fake_codex).

Every test runs the fake as a real subprocess and drives it over stdin/stdout like the
daemon would, with JSON-RPC. Every read and wait is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replay_fixtures.codex_edits import apply_unified_diff

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
FAKE_CODEX = REPO / "replay_fixtures" / "fake_codex"
CODEX = REPO / "replay_fixtures" / "codex"
MULTITURN = CODEX / "codex-0.171.0_app-server_multiturn.jsonl"
RECORDED_THREAD = "01a2268d-4ceb-7ae0-9877-694bf727b92c"
TIMEOUT = 5.0


def fake_env(cwd: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_REPLAY_") and k != "CODEX_HOME"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, "HOME": str(cwd / "home"), **extra}


class Host:
    """Drives one fake codex process: JSON-RPC lines in and out, everything with timeouts."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(FAKE_CODEX), *args], cwd=cwd, env=fake_env(cwd, env),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._ids = iter(range(1, 1000))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                self._lines.put(raw.decode().rstrip("\n"))
        finally:
            self._lines.put(None)

    def send(self, message: Json | bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(message if isinstance(message, bytes) else (json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, request_id: Any = None, **params: Any) -> Any:
        request_id = next(self._ids) if request_id is None else request_id
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return request_id

    def next(self, timeout: float = TIMEOUT) -> Json:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no stdout line within {timeout}s") from None
        if line is None:
            self._lines.put(None)
            raise AssertionError("stdout closed")
        return json.loads(line)  # type: ignore[no-any-return]

    def until(self, done: Callable[[Json], bool], timeout: float = TIMEOUT) -> list[Json]:
        deadline = time.monotonic() + timeout
        lines = []
        while not lines or not done(lines[-1]):
            lines.append(self.next(max(deadline - time.monotonic(), 0.001)))
        return lines

    def answer(self, request_id: Any) -> Json:
        return self.until(lambda m: m.get("id") == request_id and "method" not in m)[-1]

    def start(self) -> str:
        """initialize, initialized, thread/start: the thread id."""
        assert "result" in self.answer(self.request("initialize", clientInfo={"name": "t", "version": "0"}))
        self.send({"jsonrpc": "2.0", "method": "initialized"})
        return str(self.answer(self.request("thread/start", cwd="/x"))["result"]["thread"]["id"])

    def turn(self, thread_id: str, text: str, *, decide: str = "accept", interrupt_after: int | None = None) -> list[Json]:
        """One turn: answer approvals with ``decide``, interrupt after N deltas; every line of it."""
        request_id = self.request("turn/start", threadId=thread_id, input=[{"type": "text", "text": text}])
        lines, deltas = [], 0
        while True:
            line = self.next()
            lines.append(line)
            if line.get("method") == "item/commandExecution/requestApproval":
                self.send({"jsonrpc": "2.0", "id": line["id"], "result": {"decision": decide}})
            elif line.get("method") == "item/agentMessage/delta":
                deltas += 1
                if deltas == interrupt_after:
                    turn_id = next(m for m in lines if m.get("id") == request_id)["result"]["turn"]["id"]
                    self.request("turn/interrupt", "stop-it", threadId=thread_id, turnId=turn_id)
            elif line.get("method") == "turn/completed":
                return lines

    def finish(self) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=TIMEOUT), self.proc.stderr.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    hosts: list[Host] = []

    def start(*args: str, env: dict[str, str] | None = None, speed: str = "0") -> Host:
        host = Host(["app-server", "--speed", speed, *args], tmp_path, env or {})
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.close()


def run_fake(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(FAKE_CODEX), *args], cwd=cwd, env=fake_env(cwd, env or {}), input=b"", capture_output=True, timeout=10, check=False)


# -- the command line -------------------------------------------------------------------


def test_the_real_command_line_is_accepted_and_others_are_refused(tmp_path: Path) -> None:
    """--version prints the recorded version; `-c` overrides before and after app-server,
    --listen stdio:// and feature flags are accepted; another subcommand, a -c without '=',
    a non-stdio listener and a missing fixture exit 2 naming the problem."""
    version = run_fake(["--version"], tmp_path)
    assert (version.returncode, version.stdout) == (0, b"codex-cli 0.171.0\n")
    ok = run_fake(["-c", "model=gpt-mock", "app-server", "-c", 'model_providers.mock.name="mock"', "--listen", "stdio://", "--enable", "x", "--strict-config"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    for args, words in (
        (["exec", "hi"], "only `codex app-server`"),
        (["app-server", "-c", "nope"], "Invalid override"),
        (["app-server", "--listen", "ws://127.0.0.1:1"], "only --listen stdio://"),
        (["app-server", "--replay-fixture", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
    ):
        done = run_fake(args, tmp_path)
        assert done.returncode == 2 and words in done.stderr.decode(), (args, done.stderr)
    missing = run_fake(["app-server"], tmp_path, {"T3D_REPLAY_FIXTURE": str(tmp_path / "gone.jsonl")})
    assert "fake codex" in missing.stderr.decode() and "T3D_REPLAY_FIXTURE" in missing.stderr.decode()


# -- a full drive -------------------------------------------------------------------------


def test_the_multiturn_recording_with_ids_and_paths_rewritten(spawn: Callable[..., Host], tmp_path: Path) -> None:
    """Five turns: responses carry the host's ids (a string one too), the thread is the fake's
    own and every turn has a fresh id used by all its lines, the approval is server request 0
    and its resolution names it, the interrupt at the recorded point gets the host's id, and
    the recording's /workspace and home are the fake's cwd and CODEX_HOME."""
    codex_home = tmp_path / "codex-home"
    host = spawn(env={"CODEX_HOME": str(codex_home)})
    init = host.answer(host.request("initialize", "init-1", clientInfo={"name": "t", "version": "0"}))
    assert init["result"]["codexHome"] == str(codex_home)
    host.send({"jsonrpc": "2.0", "method": "initialized"})
    started = host.answer(host.request("thread/start", cwd=str(tmp_path)))
    thread_id = started["result"]["thread"]["id"]
    assert thread_id != RECORDED_THREAD and started["result"]["cwd"] == str(tmp_path)
    assert started["result"]["thread"]["path"].startswith(str(codex_home) + "/sessions/")
    turns = [
        host.turn(thread_id, "ping"),
        host.turn(thread_id, "Please run SHELL"),
        host.turn(thread_id, "Please PATCH"),
        host.turn(thread_id, "SLOW count please", interrupt_after=2),
        host.turn(thread_id, "ping again"),
    ]
    turn_ids = []
    for lines in turns:
        (response,) = [m for m in lines if "result" in m and "turn" in m["result"]]
        turn_id = response["result"]["turn"]["id"]
        turn_ids.append(turn_id)
        scoped = [m["params"] for m in lines if isinstance(m.get("params"), dict) and "turnId" in m["params"]]
        assert scoped and all(p["turnId"] == turn_id and p["threadId"] == thread_id for p in scoped)
        assert lines[-1]["params"]["turn"]["id"] == turn_id
    assert len(set(turn_ids)) == 5
    (approval,) = [m for m in turns[1] if m.get("method") == "item/commandExecution/requestApproval"]
    (resolved,) = [m for m in turns[1] if m.get("method") == "serverRequest/resolved"]
    assert approval["id"] == 0 and resolved["params"]["requestId"] == 0
    assert approval["params"]["cwd"] == str(tmp_path)
    assert [m for m in turns[3] if m.get("id") == "stop-it"] == [{"id": "stop-it", "result": {}}]
    assert [t[-1]["params"]["turn"]["status"] for t in turns] == ["completed"] * 3 + ["interrupted", "completed"]
    assert "/workspace" not in json.dumps(turns) and "/home/user" not in json.dumps(turns)
    assert host.finish()[0] == 0


def test_requests_before_initialize_twice_unknown_and_malformed(spawn: Callable[..., Host]) -> None:
    """Before initialize a request gets 'Not initialized'; a second initialize 'Already
    initialized'; an unknown method Codex's 'unknown variant'; account/read an answer; a
    line that is not JSON no answer at all, and the replay goes on."""
    host = spawn()
    assert host.answer(host.request("thread/start"))["error"]["message"] == "Not initialized"
    host.start()
    again = host.answer(host.request("initialize", clientInfo={"name": "t", "version": "0"}))
    assert again["error"] == {"code": -32600, "message": "Already initialized"}
    assert "unknown variant `bogus/method`" in host.answer(host.request("bogus/method"))["error"]["message"]
    host.send(b"{this is not json\n")
    assert host.answer(host.request("account/read", refreshToken=False))["result"]["account"] is None


def test_an_interrupt_or_a_cancelled_approval_ends_an_unrecorded_point(spawn: Callable[..., Host]) -> None:
    """An interrupt in a turn with no recorded interrupt is answered and ends the turn
    interrupted; so does an approval answered cancel (Codex interrupts on cancel); the next
    turn plays the recording's next one."""
    host = spawn(speed="1")
    thread_id = host.start()
    request_id = host.request("turn/start", threadId=thread_id, input=[{"type": "text", "text": "ping"}])
    turn_id = host.answer(request_id)["result"]["turn"]["id"]
    host.request("turn/interrupt", "int", threadId=thread_id, turnId=turn_id)
    lines = host.until(lambda m: m.get("method") == "turn/completed")
    assert {"id": "int", "result": {}} in lines
    assert (lines[-1]["params"]["turn"]["id"], lines[-1]["params"]["turn"]["status"]) == (turn_id, "interrupted")
    cancelled = host.turn(thread_id, "Please run SHELL", decide="cancel")
    assert cancelled[-1]["params"]["turn"]["status"] == "interrupted"
    assert not [m for m in cancelled if m.get("method") == "item/agentMessage/delta"]
    assert host.turn(thread_id, "Please PATCH")[-1]["params"]["turn"]["status"] == "completed"


@pytest.mark.parametrize(("speed", "factor"), [("1", 1.0), ("2", 0.5)])
def test_pacing_is_relative_to_host_input(spawn: Callable[..., Host], speed: str, factor: float) -> None:
    """The first turn's lines keep their recorded gaps from the host's turn/start (its
    completion is 330 ms after it), scaled by the speed."""
    host = spawn(speed=speed)
    thread_id = host.start()
    sent = time.monotonic()
    host.request("turn/start", threadId=thread_id, input=[{"type": "text", "text": "ping"}])
    host.until(lambda m: m.get("method") == "turn/completed")
    took = time.monotonic() - sent
    assert 0.3 * factor <= took < 0.33 * factor + 0.5, took


def test_loop_and_end_of_input(spawn: Callable[..., Host]) -> None:
    """With T3D_REPLAY_LOOP=1 the sixth turn replays the first; at stdin EOF the fake exits 0."""
    host = spawn(env={"T3D_REPLAY_LOOP": "1"})
    thread_id = host.start()
    texts = []
    for n in range(6):
        lines = host.turn(thread_id, "x", interrupt_after=2 if n == 3 else None)
        completed = [m["params"]["item"]["text"] for m in lines if m.get("method") == "item/completed" and m["params"]["item"]["type"] == "agentMessage"]
        texts.append(completed)
    assert texts[5] == texts[0] == ["pong from the mock model"]
    assert host.finish() == (0, "")


def test_threads_resume_only_where_codex_home_has_their_rollout(spawn: Callable[..., Host], tmp_path: Path) -> None:
    """With CODEX_HOME, a started thread leaves a rollout a new process resumes (its turns
    carry the resumed id); a thread without one gets 'no rollout found for thread id …'."""
    env = {"CODEX_HOME": str(tmp_path / "codex-home")}
    first = spawn(env=env)
    thread_id = first.start()
    assert first.finish()[0] == 0
    second = spawn(env=env)
    assert "result" in second.answer(second.request("initialize", clientInfo={"name": "t", "version": "0"}))
    resumed = second.answer(second.request("thread/resume", threadId=thread_id))
    assert resumed["result"]["thread"]["id"] == thread_id
    assert second.turn(thread_id, "ping")[-1]["params"]["threadId"] == thread_id
    refused = second.answer(second.request("thread/resume", threadId="not-a-thread"))
    assert refused["error"]["message"] == "no rollout found for thread id not-a-thread"


def test_recorded_file_changes_change_real_files(spawn: Callable[..., Host], tmp_path: Path) -> None:
    """With --apply-edits, a completed fileChange adds and updates the fake's files; an update
    whose old lines are not in the file changes nothing; a path out of the cwd is skipped."""
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "other.txt").write_text("something else\n")
    item = {"type": "fileChange", "id": "p", "status": "completed", "changes": [
        {"path": "notes.txt", "kind": {"type": "update", "move_path": None}, "diff": "@@ -1 +1 @@\n-hello\n+hello, world\n"},
        {"path": "other.txt", "kind": {"type": "update", "move_path": None}, "diff": "@@ -1 +1 @@\n-hello\n+nope\n"},
        {"path": "sub/new.txt", "kind": {"type": "add"}, "diff": "new\n"},
        {"path": "../escape.txt", "kind": {"type": "add"}, "diff": "no\n"}]}  # fmt: skip
    lines = MULTITURN.read_text().splitlines()
    at = next(i for i, raw in enumerate(lines) if '"type":"agentMessage"' in raw)
    fixture = tmp_path / "patch.jsonl"
    fixture.write_text("\n".join([*lines[:at], json.dumps({"method": "item/completed", "params": {"item": item, "threadId": RECORDED_THREAD}}), *lines[at:]]) + "\n")
    host = spawn("--replay-fixture", str(fixture), "--apply-edits")
    host.turn(host.start(), "ping")
    assert (tmp_path / "notes.txt").read_text() == "hello, world\n"
    assert (tmp_path / "other.txt").read_text() == "something else\n"
    assert (tmp_path / "sub" / "new.txt").read_text() == "new\n"
    assert not (tmp_path.parent / "escape.txt").exists()


def test_unified_diffs_apply_hunk_by_hunk() -> None:
    """Hunks replace their old lines at their place; context must match."""
    text = "a\nb\nc\nd\ne\n"
    diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n@@ -4,2 +4,3 @@\n d\n-e\n+E\n+F\n"
    assert apply_unified_diff(text, diff) == "a\nB\nc\nd\nE\nF\n"
    assert apply_unified_diff(text, "@@ -2 +2 @@\n-x\n+y\n") is None


def test_sigterm_ends_the_fake_at_once(spawn: Callable[..., Host]) -> None:
    """SIGTERM has its default action, even mid-turn at recorded pace."""
    host = spawn(speed="1")
    thread_id = host.start()
    host.request("turn/start", threadId=thread_id, input=[{"type": "text", "text": "ping"}])
    host.proc.send_signal(signal.SIGTERM)
    assert host.proc.wait(timeout=TIMEOUT) == -signal.SIGTERM
