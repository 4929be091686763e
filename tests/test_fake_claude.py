"""Tests for the fake `claude` CLI (replay_fixtures/fake_claude).

Every test runs the fake as a real subprocess and drives it over stdin/stdout like the
daemon would. Every read and wait is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

Json = dict[str, Any]

# Located from this file, so the tests run whether or not the project is installed.
REPO = Path(__file__).resolve().parents[1]
FAKE_CLAUDE = REPO / "replay_fixtures" / "fake_claude"
FIXTURES_DIR = REPO / "replay_fixtures" / "claude"
DEFAULT_FIXTURE = FIXTURES_DIR / "claude-2.1.197_multiturn_tools.jsonl"

SDK_ARGS = [
    "--output-format",
    "stream-json",
    "--verbose",
    "--input-format",
    "stream-json",
    "--include-partial-messages",
    "--permission-prompt-tool",
    "stdio",
    "--permission-mode",
    "default",
]
RECORDED_SESSION = "60944ebc-54c1-4013-a3d5-b449711c64f6"
NEW_SESSION = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
RESUME = FIXTURES_DIR / "claude-2.1.197_resume.jsonl"
MULTITURN_TURNS = [
    "Please READ notes.txt",
    "Now EDIT notes.txt",
    "Now run BASH to create a file",
    "COUNT to 200 slowly",
    "Say ok",
]
TIMEOUT = 5.0


def user(text: str) -> Json:
    return {
        "type": "user",
        "message": {"role": "user", "content": text},
        "parent_tool_use_id": None,
        "session_id": "",
    }


def control_request(request_id: str, subtype: str, **fields: Any) -> Json:
    return {
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": subtype, **fields},
    }


def permission_answer(prompt: Json, allow: bool) -> Json:
    request = prompt["request"]
    answer = (
        {"behavior": "allow", "updatedInput": request["input"]}
        if allow
        else {"behavior": "deny", "message": "Denied by the test host."}
    )
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": prompt["request_id"], "response": answer},
    }


def is_type(kind: str, subtype: str | None = None) -> Callable[[Json], bool]:
    return lambda obj: (
        obj.get("type") == kind and (subtype is None or obj.get("subtype") == subtype)
    )


def is_delta(obj: Json) -> bool:
    return obj.get("type") == "stream_event" and obj["event"]["type"] == "content_block_delta"


def fake_env(extra: dict[str, str]) -> dict[str, str]:
    """The test environment without T3D_REPLAY_* settings, with this Python first on PATH.

    The wrapper runs `#!/usr/bin/env python3`; putting the interpreter's directory first
    avoids a slow version-manager shim on every spawn (test_version covers the plain PATH).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_REPLAY_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, **extra}


class Host:
    """Drives one fake CLI process: NDJSON in, NDJSON out, everything with timeouts."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        full_env = fake_env({"HOME": str(cwd / "home"), **(env or {})})
        self.proc = subprocess.Popen(
            [str(FAKE_CLAUDE), *args],
            cwd=cwd,
            env=full_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.received: list[Json] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for raw in self.proc.stdout:
                self._lines.put(raw.decode("utf-8").rstrip("\n"))
        finally:
            self._lines.put(None)

    def send(self, *messages: Json) -> None:
        assert self.proc.stdin is not None
        for message in messages:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def next(self, timeout: float = TIMEOUT) -> Json:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no stdout line within {timeout}s") from None
        if line is None:
            self._lines.put(None)
            raise AssertionError("stdout closed")
        obj: Json = json.loads(line)
        self.received.append(obj)
        return obj

    def read_until(self, done: Callable[[Json], bool], timeout: float = TIMEOUT) -> list[Json]:
        deadline = time.monotonic() + timeout
        lines = []
        while True:
            lines.append(self.next(max(deadline - time.monotonic(), 0.001)))
            if done(lines[-1]):
                return lines

    def wait_ready(self) -> None:
        """Round-trip an initialize request, so timings below exclude process start-up."""
        self.send(control_request("ready", "initialize"))
        assert self.next()["response"]["request_id"] == "ready"

    def assert_silent(self, seconds: float = 0.2) -> None:
        with pytest.raises(queue.Empty):
            self._lines.get(timeout=seconds)

    def finish(self, timeout: float = TIMEOUT) -> tuple[int, list[Json], str]:
        """Close stdin and wait: (exit code, remaining stdout lines, stderr)."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        rest = []
        while (line := self._lines.get(timeout=timeout)) is not None:
            rest.append(json.loads(line))
        return code, rest, self.proc.stderr.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)
        self._reader.join(timeout=TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    hosts: list[Host] = []

    def start(*args: str, env: dict[str, str] | None = None, speed: str | None = "0") -> Host:
        speed_args = [] if speed is None else ["--speed", speed]
        host = Host([*SDK_ARGS, *speed_args, *args], tmp_path, env)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.close()


def run_fake(
    args: list[str], cwd: Path, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(FAKE_CLAUDE), *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env=fake_env(env or {}),
        timeout=TIMEOUT,
    )


def rewritten(text: str, cwd: Path, session: str | None = None) -> str:
    """What the fake should print for a recorded line (independent re-implementation)."""
    project_dir = re.sub(r"[^A-Za-z0-9]", "-", str(cwd))
    text = text.replace("/projects/-workspace/", f"/projects/{project_dir}/")
    text = text.replace("/home/user", str(cwd / "home")).replace("/workspace", str(cwd))
    return text if session is None else text.replace(RECORDED_SESSION, session)


def recorded_stdout(fixture: Path, cwd: Path, session: str | None = None) -> list[Json]:
    lines = fixture.read_text().splitlines()
    return [
        json.loads(rewritten(line, cwd, session))
        for line in lines
        if line and not line.startswith(">>> ")
    ]


def final_lines(objs: list[Json]) -> list[Json]:
    """The lines whose content is final: no stream_event pieces, no replies to host requests."""
    return [obj for obj in objs if obj["type"] not in ("stream_event", "control_response")]


def assert_deltas_match_blocks(objs: list[Json]) -> None:
    """Each assistant block matches the concatenation of the deltas streamed for it."""
    pieces: dict[int, str] = {}
    last_index = None
    checked = 0
    for obj in objs:
        if obj["type"] == "stream_event" and obj["event"]["type"] == "message_start":
            pieces, last_index = {}, None
        elif is_delta(obj):
            delta, last_index = obj["event"]["delta"], obj["event"]["index"]
            pieces[last_index] = pieces.get(last_index, "") + delta.get(
                "text", delta.get("partial_json", "")
            )
        elif (
            obj["type"] == "assistant"
            and last_index is not None
            and not obj.get("parent_tool_use_id")
        ):
            # (a subagent's lines are not streamed: they come whole, between the main agent's deltas)
            (block,) = obj["message"]["content"]
            streamed = pieces[last_index]
            if block["type"] == "text":
                assert block["text"] == streamed
            else:  # the CLI adds defaulted fields (e.g. Edit's replace_all) to the final input
                assert json.loads(streamed).items() <= block["input"].items()
            checked += 1
    assert checked or not any(is_delta(obj) for obj in objs)


def drive_turn(host: Host, text: str, allow: bool = True) -> list[Json]:
    """Send one user turn and read to its result, answering permission prompts."""
    host.send(user(text))
    lines = []
    while True:
        obj = host.next()
        lines.append(obj)
        if obj["type"] == "control_request" and obj["request"]["subtype"] == "can_use_tool":
            host.send(permission_answer(obj, allow))
        if obj["type"] == "result":
            return lines


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def test_package_helpers_point_at_the_bundle() -> None:
    probe = "import replay_fixtures as r; print(r.FAKE_CLAUDE, r.FIXTURES_DIR, r.DEFAULT_FIXTURE)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, timeout=TIMEOUT, check=True
    )
    assert done.stdout.decode().split() == [
        str(FAKE_CLAUDE),
        str(FIXTURES_DIR),
        str(DEFAULT_FIXTURE),
    ]
    assert os.access(FAKE_CLAUDE, os.X_OK) and DEFAULT_FIXTURE.is_file()


def test_version(tmp_path: Path) -> None:
    done = run_fake(["--version"], tmp_path, env={"PATH": os.environ["PATH"]})
    assert (done.returncode, done.stdout, done.stderr) == (0, b"2.1.197 (Claude Code)\n", b"")
    missing = run_fake(["-v"], tmp_path, env={"T3D_REPLAY_FIXTURE": str(tmp_path / "nope.jsonl")})
    assert (missing.returncode, missing.stdout) == (0, b"2.1.197 (Claude Code)\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-p", "hi", "--output-format", "stream-json"],
            "Error: When using --print, --output-format=stream-json requires --verbose",
        ),
        (
            ["-p", "--input-format", "stream-json"],
            "Error: --input-format=stream-json requires output-format=stream-json.",
        ),
        (
            [*SDK_ARGS, "--session-id", "not-a-uuid"],
            "Error: Invalid session ID. Must be a valid UUID.",
        ),
    ],
)
def test_flag_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_fake(args, tmp_path)
    assert (done.returncode, done.stdout, done.stderr.decode()) == (1, b"", message + "\n")


def test_missing_fixture_names_path_and_env(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    done = run_fake(SDK_ARGS, tmp_path, env={"T3D_REPLAY_FIXTURE": str(missing)})
    assert done.returncode == 2
    assert str(missing) in done.stderr.decode() and "T3D_REPLAY_FIXTURE" in done.stderr.decode()
    flag = run_fake([*SDK_ARGS, "--replay-fixture", str(missing)], tmp_path)
    assert flag.returncode == 2 and str(missing) in flag.stderr.decode()


def test_accepts_real_and_unknown_flags(spawn: Callable[..., Host]) -> None:
    host = spawn(
        "-p",
        "--replay-user-messages",
        "--permission-prompt-tool=stdio",
        "--model",
        "sonnet",
        "--mcp-config",
        '{"mcpServers":{}}',
        "--strict-mcp-config",
        "--allowedTools",
        "Read",
        "Edit",
        "--disallowedTools",
        "Bash",
        "--append-system-prompt",
        "be brief",
        "--system-prompt",
        "you are a test",
        "--max-turns",
        "3",
        "--setting-sources",
        "user,project",
        "--add-dir",
        "/tmp",
        "-c",
        "--fork-session",
        "--some-future-flag",
        "its-value",
        "--another-future-switch",
        "--replay-fixture",
        str(RESUME),
    )
    drive_turn(host, "Say ok again")
    code, _, stderr = host.finish()
    assert (code, stderr) == (0, "")


# ---------------------------------------------------------------------------------------
# Replaying the recordings
# ---------------------------------------------------------------------------------------


def test_multiturn_full_drive(spawn: Callable[..., Host], tmp_path: Path) -> None:
    host = spawn()  # the bundled default fixture
    host.send(control_request("init-1", "initialize", hooks=None))
    turn1 = drive_turn(host, MULTITURN_TURNS[0])
    assert turn1[0]["type"] == "control_response" and turn1[0]["response"]["request_id"] == "init-1"

    host.send(user(MULTITURN_TURNS[1]))
    edit_prompt = host.read_until(is_type("control_request"))[-1]
    assert edit_prompt["request"]["tool_name"] == "Edit"
    assert edit_prompt["request"]["input"]["file_path"] == f"{tmp_path}/notes.txt"
    host.send(permission_answer(edit_prompt, allow=True))
    host.read_until(is_type("result"))

    host.send(user(MULTITURN_TURNS[2]))
    bash_prompt = host.read_until(is_type("control_request"))[-1]
    assert bash_prompt["request"]["tool_name"] == "Bash"
    host.send(permission_answer(bash_prompt, allow=False))
    host.read_until(is_type("result"))

    host.send(user(MULTITURN_TURNS[3]))
    host.read_until(is_delta)
    host.read_until(is_delta)
    host.send(control_request("my-interrupt", "interrupt"))
    turn4_end = host.read_until(is_type("result"))
    replies = [obj for obj in turn4_end if obj["type"] == "control_response"]
    assert replies == [
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": "my-interrupt"},
        }
    ]
    interrupted = turn4_end[-1]
    assert interrupted["subtype"] == "error_during_execution" and interrupted["is_error"] is True
    assert interrupted["terminal_reason"] == "aborted_streaming"
    assert interrupted["session_id"] == RECORDED_SESSION

    drive_turn(host, MULTITURN_TURNS[4])
    code, rest, stderr = host.finish()
    assert (code, rest, stderr) == (0, [], "")

    received = host.received
    expected = recorded_stdout(DEFAULT_FIXTURE, tmp_path)
    # The interrupted turn's partial text is what the fake streamed before the interrupt
    # (all the recorded deltas when it came late, fewer when it came early): a prefix of the
    # recorded partial text. Everything else is as recorded.
    partial = interrupted_partial(expected)
    streamed = interrupted_partial(received)
    assert partial["message"]["content"][0]["text"].startswith(
        streamed["message"]["content"][0]["text"]
    )
    streamed_as_recorded = [partial if o is streamed else o for o in received]
    assert final_lines(streamed_as_recorded) == final_lines(expected)
    wanted = {"assistant", "result"}
    assert [o for o in streamed_as_recorded if o["type"] in wanted] == [
        o for o in expected if o["type"] in wanted
    ]
    assert sum(o["type"] == "result" for o in received) == 5
    assert [o["response"]["request_id"] for o in received if o["type"] == "control_response"] == [
        "init-1",
        "my-interrupt",
    ]
    assert_deltas_match_blocks(received)
    assert "/workspace" not in json.dumps(received)
    assert {o["session_id"] for o in received if "session_id" in o} == {RECORDED_SESSION}


def interrupted_partial(objs: list[Json]) -> Json:
    """The partial assistant line of the interrupted turn (the one before the interrupt notice)."""
    notice = next(
        i
        for i, o in enumerate(objs)
        if o["type"] == "user" and "[Request interrupted" in json.dumps(o["message"])
    )
    return next(o for o in reversed(objs[:notice]) if o["type"] == "assistant")


RECORDINGS = sorted(path.name for path in FIXTURES_DIR.glob("*.jsonl"))


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recording_replays(spawn: Callable[..., Host], tmp_path: Path, name: str) -> None:
    """Each recording replays to its recorded stdout (final lines equal, deltas matching their
    blocks) and exits with its recorded code, the host's messages all sent at once (queued by
    the fake, as the CLI queues them; one is steered mid-turn in the steer recording), its
    prompts answered, and the lines a background task's wake writes with no message before
    them played as recorded."""
    fixture = FIXTURES_DIR / name
    host_lines = [
        json.loads(line[4:]) for line in fixture.read_text().splitlines() if line.startswith(">>> ")
    ]
    turns = sum(obj["type"] == "user" for obj in host_lines) or 1
    host = spawn("--replay-fixture", str(fixture), env={"T3D_REPLAY_INTERRUPT_TIMEOUT": "0"})
    host.send(*(user(f"turn {turn}") for turn in range(turns)))
    expected = recorded_stdout(fixture, tmp_path)
    results = sum(o["type"] == "result" for o in expected)
    while sum(o["type"] == "result" for o in host.received) < results:
        obj = host.next()
        if obj["type"] == "control_request" and obj["request"]["subtype"] == "can_use_tool":
            host.send(permission_answer(obj, True))
    code, rest, stderr = host.finish()
    assert (rest, stderr) == ([], "")
    assert code == recorded_exit_code(fixture, expected)
    assert final_lines(host.received) == final_lines(expected)
    assert_deltas_match_blocks(host.received)


def recorded_exit_code(fixture: Path, expected: list[Json]) -> int:
    meta = fixture.with_name(fixture.name.split(".")[0] + ".meta.json")
    if meta.exists() and isinstance(json.loads(meta.read_text()).get("exit_code"), int):
        return int(json.loads(meta.read_text())["exit_code"])
    results = [o for o in expected if o["type"] == "result"]
    return 1 if results and results[-1].get("is_error") else 0


def test_workspace_and_home_rewritten(spawn: Callable[..., Host], tmp_path: Path) -> None:
    host = spawn("--replay-fixture", str(RESUME))
    init = drive_turn(host, "Say ok again")[0]
    assert init["subtype"] == "init" and init["cwd"] == str(tmp_path)
    project_dir = re.sub(r"[^A-Za-z0-9]", "-", str(tmp_path))
    assert init["memory_paths"]["auto"] == f"{tmp_path}/home/.claude/projects/{project_dir}/memory/"
    assert "/workspace" not in json.dumps(host.received) and "/home/user" not in json.dumps(
        host.received
    )


@pytest.mark.parametrize("flag", ["--session-id", "--resume", "-r"])
def test_session_id_rewritten(spawn: Callable[..., Host], tmp_path: Path, flag: str) -> None:
    host = spawn(flag, NEW_SESSION, env={"T3D_REPLAY_INTERRUPT_TIMEOUT": "0"})
    host.send(control_request("i", "initialize"))
    lines = drive_turn(host, MULTITURN_TURNS[0])
    assert {o["session_id"] for o in lines if "session_id" in o} == {NEW_SESSION}
    assert RECORDED_SESSION not in json.dumps(lines)
    assert (
        final_lines(lines)
        == final_lines(recorded_stdout(DEFAULT_FIXTURE, tmp_path, NEW_SESSION))[
            : len(final_lines(lines))
        ]
    )


# ---------------------------------------------------------------------------------------
# Host control requests
# ---------------------------------------------------------------------------------------


def test_initialize_answered_at_any_time(spawn: Callable[..., Host]) -> None:
    host = spawn(speed="4")
    host.send(control_request("before", "initialize", hooks=None))
    before = host.next()
    assert before["response"]["request_id"] == "before"
    payload = before["response"]["response"]
    assert (
        payload["pid"] == host.proc.pid
        and payload["commands"]
        and payload["account"]["tokenSource"] == "none"
    )

    host.send(user(MULTITURN_TURNS[0]), control_request("during", "initialize"))
    during = host.next()  # the turn's first line is recorded ~0.8 s after the prompt
    assert during["type"] == "control_response" and during["response"]["request_id"] == "during"
    assert during["response"]["response"] == payload
    host.read_until(is_type("result"))

    host.send(control_request("between", "initialize"))
    assert host.next()["response"]["request_id"] == "between"
    code, rest, _ = host.finish()
    assert (code, rest) == (0, [])
    assert "req_init_585302f0" not in json.dumps(host.received)


def test_initialize_without_recorded_payload(spawn: Callable[..., Host]) -> None:
    host = spawn("--replay-fixture", str(RESUME))
    host.send(control_request("i", "initialize"))
    assert host.next() == {
        "type": "control_response",
        "response": {
            "subtype": "success",
            "request_id": "i",
            "response": {
                "commands": [],
                "agents": [],
                "models": [],
                "account": {"tokenSource": "none", "apiProvider": "firstParty"},
                "pid": host.proc.pid,
            },
        },
    }


def test_other_control_requests_and_ignored_lines(spawn: Callable[..., Host]) -> None:
    host = spawn("--replay-fixture", str(RESUME))
    host.send(control_request("m", "set_permission_mode", mode="acceptEdits"))
    assert host.next()["response"] == {
        "subtype": "success",
        "request_id": "m",
        "response": {"mode": "acceptEdits"},
    }
    host.send(control_request("s", "set_model", model="sonnet"))
    assert host.next()["response"] == {"subtype": "success", "request_id": "s"}
    host.send(control_request("x", "mcp_status"))
    assert host.next()["response"] == {
        "subtype": "error",
        "request_id": "x",
        "error": "Unsupported control request subtype: mcp_status",
    }
    host.send(
        {"type": "keep_alive"},
        {"type": "bogus_type"},
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": "nobody-asked"},
        },
    )
    host.assert_silent()
    host.send(user("hi"))
    assert host.next()["subtype"] == "init"
    host.read_until(is_type("result"))
    code, rest, stderr = host.finish()
    assert (code, rest, stderr) == (0, [], "")


def test_interrupt_at_unrecorded_point_ends_turn(spawn: Callable[..., Host]) -> None:
    host = spawn("--replay-fixture", str(RESUME), "--replay-loop", speed="4")
    host.wait_ready()
    started = time.monotonic()
    host.send(user("Say ok again"), control_request("stop", "interrupt"))
    reply, notice, result = host.next(), host.next(), host.next()
    assert time.monotonic() - started < 1.0
    assert reply == {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": "stop"},
    }
    assert notice["type"] == "user"
    assert notice["message"]["content"] == [
        {"type": "text", "text": "[Request interrupted by user]"}
    ]
    assert result["type"] == "result" and result["subtype"] == "error_during_execution"
    assert result["is_error"] is True and result["terminal_reason"] == "aborted_streaming"
    assert result["session_id"] == notice["session_id"] == RECORDED_SESSION
    host.assert_silent()
    # The next user message plays the next turn (here: the loop restarts the single turn).
    assert [o["type"] for o in drive_turn(host, "again")] == ["system", "assistant", "result"]


def test_interrupt_while_waiting_for_permission(spawn: Callable[..., Host]) -> None:
    host = spawn()
    first_result = drive_turn(host, MULTITURN_TURNS[0])[-1]
    host.send(user(MULTITURN_TURNS[1]))
    prompt = host.read_until(is_type("control_request"))[-1]
    host.send(control_request("int-2", "interrupt"))
    reply, _, result = host.next(), host.next(), host.next()
    assert reply["response"]["request_id"] == "int-2"
    assert result["terminal_reason"] == "aborted_streaming"
    assert result["total_cost_usd"] == first_result["total_cost_usd"]
    host.send(permission_answer(prompt, allow=True))  # too late: ignored
    bash_turn = drive_turn(host, MULTITURN_TURNS[2], allow=False)
    assert bash_turn[-1]["result"] == "The tool call was not allowed, so I stopped there."


def write_slice(tmp_path: Path, picks: list[tuple[int, float]]) -> Path:
    """A fixture made of chosen lines of the multiturn recording, with new timings (ms)."""
    source = DEFAULT_FIXTURE.read_text().splitlines()
    fixture = tmp_path / "slice.jsonl"
    fixture.write_text("".join(source[index] + "\n" for index, _ in picks))
    rows = [
        f"{ms:g}\t{'in' if source[i].startswith('>>> ') else 'out'}\t{n}\n"
        for n, (i, ms) in enumerate(picks)
    ]
    (tmp_path / "slice.timing.tsv").write_text("".join(rows))
    return fixture


def recorded_timing() -> dict[int, float]:
    rows = (
        row.split("\t")
        for row in DEFAULT_FIXTURE.with_suffix(".timing.tsv").read_text().splitlines()
    )
    return {int(index): float(ms) for ms, _, index in rows}


def test_interrupt_before_recorded_point_jumps_to_it(
    spawn: Callable[..., Host], tmp_path: Path
) -> None:
    timing = recorded_timing()
    fixture = write_slice(tmp_path, [(i, timing[i]) for i in range(122, 138)])  # the COUNT turn
    host = spawn("--replay-fixture", str(fixture), speed="1")
    host.send(user("COUNT to 200 slowly"))
    host.read_until(is_delta)
    host.read_until(is_delta)  # the recording was interrupted after the 6th delta
    host.send(control_request("early", "interrupt"))
    rest = host.read_until(is_type("result"))
    assert rest[0] == {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": "early"},
    }
    recorded = final_lines(recorded_stdout(fixture, tmp_path))[-3:]
    assert final_lines(rest)[1:] == recorded[1:]
    assert [o["type"] for o in final_lines(rest)] == ["assistant", "user", "result"]
    # The partial assistant line holds the text streamed before the jump, not the recorded
    # text (which has deltas the fake skipped): a prefix of it.
    partial = final_lines(rest)[0]["message"]["content"][0]["text"]
    streamed = "".join(o["event"]["delta"]["text"] for o in host.received if is_delta(o))
    assert partial == streamed
    assert recorded[0]["message"]["content"][0]["text"].startswith(partial)
    assert {k: v for k, v in final_lines(rest)[0].items() if k != "message"} == {
        k: v for k, v in recorded[0].items() if k != "message"
    }


def test_permission_answer_before_the_wait_point(
    spawn: Callable[..., Host], tmp_path: Path
) -> None:
    # user, can_use_tool, content_block_stop 300 ms later, >>> answer, result
    fixture = write_slice(tmp_path, [(84, 0), (99, 10), (100, 300), (101, 300), (121, 310)])
    host = spawn("--replay-fixture", str(fixture), speed="1")
    host.send(user("Now run BASH to create a file"))
    prompt = host.read_until(is_type("control_request"))[-1]
    host.send(permission_answer(prompt, allow=False))
    assert host.read_until(is_type("result"), timeout=2.0)[-1]["subtype"] == "success"


# ---------------------------------------------------------------------------------------
# Turns, pacing, loop and end of input
# ---------------------------------------------------------------------------------------


def test_early_user_message_is_queued(spawn: Callable[..., Host]) -> None:
    host = spawn()
    host.send(user(MULTITURN_TURNS[0]), user(MULTITURN_TURNS[1]))
    host.read_until(is_type("result"))
    prompt = host.read_until(is_type("control_request"))[-1]  # turn 2 starts with no new input
    assert prompt["request"]["tool_name"] == "Edit"


@pytest.mark.parametrize(
    ("flag", "env", "factor"),
    [("1", {}, 1.0), (None, {"T3D_REPLAY_SPEED": "2"}, 0.5)],
)
def test_pacing_is_relative_to_host_input(
    spawn: Callable[..., Host],
    tmp_path: Path,
    flag: str | None,
    env: dict[str, str],
    factor: float,
) -> None:
    # user @0, init @300, user @5000, result @5300: each line is 300 ms after its input.
    fixture = write_slice(tmp_path, [(38, 0), (39, 300), (84, 5000), (121, 5300)])
    host = spawn("--replay-fixture", str(fixture), speed=flag, env=env)
    host.wait_ready()
    for _ in range(2):
        sent = time.monotonic()
        host.send(user("go"))
        host.next()
        assert 0.25 * factor <= time.monotonic() - sent < 0.3 * factor + 0.5


def test_invalid_speed(tmp_path: Path) -> None:
    done = run_fake([*SDK_ARGS, "--speed", "fast"], tmp_path)
    assert done.returncode == 2 and "speed" in done.stderr.decode()


def test_replay_loop_restarts_at_first_turn(spawn: Callable[..., Host]) -> None:
    host = spawn("--replay-loop", env={"T3D_REPLAY_INTERRUPT_TIMEOUT": "0"})
    first = [drive_turn(host, text) for text in MULTITURN_TURNS]
    again = drive_turn(host, "one more")
    assert final_lines(again) == final_lines(first[0])
    code, rest, _ = host.finish()
    assert (code, rest) == (0, [])


def test_loop_from_environment_and_no_loop_by_default(spawn: Callable[..., Host]) -> None:
    looping = spawn("--replay-fixture", str(RESUME), env={"T3D_REPLAY_LOOP": "1"})
    assert drive_turn(looping, "a")[-1] == drive_turn(looping, "b")[-1]
    single = spawn("--replay-fixture", str(RESUME))
    drive_turn(single, "a")
    single.send(user("b"))
    single.assert_silent()
    code, rest, _ = single.finish()
    assert (code, rest) == (0, [])


def test_stdin_eof(tmp_path: Path) -> None:
    idle = run_fake(SDK_ARGS, tmp_path)
    assert (idle.returncode, idle.stdout, idle.stderr) == (0, b"", b"")
    piped = run_fake(
        [*SDK_ARGS, "--speed", "0", "--replay-fixture", str(RESUME)],
        tmp_path,
        (json.dumps(user("x")) + "\n").encode(),
    )
    assert piped.returncode == 0
    assert [json.loads(line)["type"] for line in piped.stdout.splitlines()] == [
        "system",
        "assistant",
        "result",
    ]


def test_malformed_stdin_line_is_fatal(spawn: Callable[..., Host]) -> None:
    host = spawn()
    host.send_raw(b"this is not json\n")
    code, rest, stderr = host.finish()
    assert (code, rest) == (1, [])
    assert stderr.startswith("Error parsing streaming input line: this is not json: SyntaxError: ")


ONE_SHOT = FIXTURES_DIR / "claude-2.1.197_oneshot_bypass.stdout.jsonl"


def test_one_shot_prompt_argument(tmp_path: Path) -> None:
    args = ["-p", "run BASH", "--output-format", "stream-json", "--verbose"]
    done = run_fake(
        [*args, "--replay-fixture", str(ONE_SHOT)], tmp_path, env={"HOME": str(tmp_path / "home")}
    )
    assert done.returncode == 0
    received = [json.loads(line) for line in done.stdout.splitlines()]
    assert received == recorded_stdout(ONE_SHOT, tmp_path)


def test_one_shot_text_and_json_output(tmp_path: Path) -> None:
    result = recorded_stdout(ONE_SHOT, tmp_path)[-1]
    fixture = ["--replay-fixture", str(ONE_SHOT)]
    text = run_fake(["-p", *fixture], tmp_path, stdin=b"run BASH\n")
    assert (text.returncode, text.stdout.decode()) == (0, result["result"] + "\n")
    as_json = run_fake(["-p", "run BASH", "--output-format", "json", *fixture], tmp_path)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == result
    empty = run_fake(["-p", *fixture], tmp_path)
    assert empty.returncode == 1 and empty.stderr.startswith(b"Error: Input must be provided")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_exit_promptly(spawn: Callable[..., Host], signum: signal.Signals) -> None:
    host = spawn(speed="1")
    host.wait_ready()
    host.send(user(MULTITURN_TURNS[0]))  # mid-turn, pacing
    host.proc.send_signal(signum)
    assert host.proc.wait(timeout=2.0) == -signum


def test_closed_stdout_exits_quietly(tmp_path: Path) -> None:
    with subprocess.Popen(
        [str(FAKE_CLAUDE), *SDK_ARGS, "--speed", "0", "--replay-fixture", str(RESUME)],
        cwd=tmp_path,
        env=fake_env({}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stdin.write((json.dumps(user("x")) + "\n").encode())
        proc.stdin.flush()
        assert proc.wait(timeout=TIMEOUT) == 0
        assert proc.stderr.read() == b""


BASH_WAKE = FIXTURES_DIR / "claude-2.1.197_background_bash_wake.jsonl"


def test_a_wake_plays_with_no_user_message_and_an_interrupt_between_turns_is_only_answered(
    spawn: Callable[..., Host], tmp_path: Path
) -> None:
    """After a turn's result, the background task's lines and the wake (init ... result) play
    at their recorded time with no user message before them; an interrupt that arrives
    between the result and the wake is answered and ends nothing; every stdin line is in
    T3D_REPLAY_HOST_LOG."""
    log = tmp_path / "host.log"
    host = spawn(
        "--replay-fixture", str(BASH_WAKE), speed="0.5", env={"T3D_REPLAY_HOST_LOG": str(log)}
    )
    host.send(user("Please run BGBASH now"))
    host.read_until(is_type("result"))
    host.send(control_request("between", "interrupt"))
    reply = host.read_until(is_type("control_response"))[-1]
    assert reply["response"]["request_id"] == "between"
    wake = host.read_until(is_type("result"))
    assert [o["type"] for o in wake if o["type"] in ("system", "result")][:3] == [
        "system",
        "system",
        "system",
    ]
    assert wake[-1]["subtype"] == "success" and wake[-1]["origin"] == {"kind": "task-notification"}
    expected = [o for o in recorded_stdout(BASH_WAKE, tmp_path) if o["type"] == "result"]
    assert [o for o in host.received if o["type"] == "result"] == expected
    assert [json.loads(line)["type"] for line in log.read_text().splitlines()] == [
        "user",
        "control_request",
    ]


def test_an_interrupt_in_a_wake_ends_that_wake_only(
    spawn: Callable[..., Host], tmp_path: Path
) -> None:
    """Two wakes after one user message: an interrupt while the first wake streams ends it
    (an interrupted result), and the second wake still plays as recorded."""
    lines = BASH_WAKE.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith('{"type":"result"'))
    combined = [*lines, *lines[end + 1 :]]
    fixture = tmp_path / "two-wakes.jsonl"
    fixture.write_text("\n".join(combined) + "\n")
    # No delays but in the first wake, whose lines come 100 ms apart: it is still streaming
    # when the interrupt arrives.
    first_wake = range(
        end + 1,
        next(i for i in range(end + 1, len(combined)) if combined[i].startswith('{"type":"result"'))
        + 1,
    )
    times, at = [], 0.0
    for index, line in enumerate(combined):
        at += 100.0 if index in first_wake else 0.0
        times.append(f"{at:g}\t{'in' if line.startswith('>>> ') else 'out'}\t{index}\n")
    (tmp_path / "two-wakes.timing.tsv").write_text("".join(times))
    host = spawn("--replay-fixture", str(fixture), speed="1")
    host.send(user("Please run BGBASH now"))
    host.read_until(is_type("result"))
    host.read_until(is_delta)  # the first wake streams
    host.send(control_request("in-wake", "interrupt"))
    first = host.read_until(is_type("result"))[-1]
    assert (first["subtype"], first["terminal_reason"]) == (
        "error_during_execution",
        "aborted_streaming",
    )
    second = host.read_until(is_type("result"))[-1]
    assert second["subtype"] == "success" and second["origin"] == {"kind": "task-notification"}


def test_an_interrupt_before_a_steered_line_ends_the_turn_and_the_steered_answer_plays(
    spawn: Callable[..., Host], tmp_path: Path
) -> None:
    """The steered message and an interrupt arrive before the fake has reached the recorded
    steered user line: that line is inside the turn, not its end, so the interrupt still ends
    the turn (at its recorded interrupt point), the host's message stands for the recorded
    steered one, and the answer to it (the next init ... result) plays, as 2.1.197 did."""
    recording = FIXTURES_DIR / "claude-2.1.197_steer_interrupted.jsonl"
    host = spawn("--replay-fixture", str(recording), speed="1")
    host.send(user("Please STEER this: count to 60"))
    host.read_until(is_delta)  # streaming, ~0.9 s before the recorded steered line
    host.send(
        user("STEERED: also say that you were steered"), control_request("int-1", "interrupt")
    )
    reply = host.read_until(is_type("control_response"))[-1]
    assert reply["response"]["request_id"] == "int-1"
    first = host.read_until(is_type("result"))[-1]
    assert first["subtype"] == "error_during_execution"
    second = host.read_until(is_type("result"))[-1]
    assert (second["subtype"], second["result"]) == ("success", "ok")
