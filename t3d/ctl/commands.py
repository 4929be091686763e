"""`t3d ctl status|threads|run|stop|memory`: the admin and terminal client, over the public API only.

:func:`run_ctl` resolves the same settings as `t3d serve`, runs one
subcommand under ``trio.run`` and turns every expected failure into one
``error: ...`` line on stderr and an exit status:

- 0: success (the turn completed; the daemon is healthy)
- 1: the turn failed, was interrupted or cancelled; the daemon rejected a
  call (JSON-RPC error); health is not ``ok``
- 2: usage, settings, token or connection problems
- 130: Ctrl-C (during `run`: the second one; the first interrupts the turn)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import trio

from t3d.config import load_settings
from t3d.ctl.client import (
    EXIT_USAGE,
    CtlError,
    Endpoint,
    JsonDict,
    RpcConnection,
    RpcError,
    http_get_json,
    new_command_id,
    open_rpc,
    read_token,
    unwrap_group,
)
from t3d.ctl.render import (
    ApprovalPrompt,
    Rendered,
    TurnRenderer,
    count_threads,
    format_memory,
    format_status,
    format_threads_table,
    one_line,
)
from t3d.errors import ConfigError

EXIT_OK = 0
EXIT_SIGINT = 130
THREAD_TITLE_CHARS = 60
# How long `status` waits for a memory-pressure reading.
MEMORY_WAIT_S = 3.0


def add_ctl_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ctl subcommands and the common flags to the ``ctl`` parser.

    The common flags are accepted before and after the subcommand
    (``t3d ctl --port 4000 status`` and ``t3d ctl status --port 4000``).
    """
    _add_common_flags(parser, default=None)
    common = argparse.ArgumentParser(add_help=False)
    _add_common_flags(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="ctl_command", metavar="COMMAND", required=True)
    commands.add_parser(
        "status", parents=[common], help="is the daemon up: version, uptime, projects and threads"
    )
    stop = commands.add_parser(
        "stop", parents=[common], help="stop a thread's running turn (--force: kill its agent)"
    )
    stop.add_argument("thread", metavar="THREAD", help="the thread's id")
    stop.add_argument(
        "--force",
        action="store_true",
        help="kill the agent's process group (TERM, a grace period, KILL); the turn ends cancelled",
    )
    commands.add_parser(
        "memory", parents=[common], help="watch memory pressure and the heaviest agents live"
    )
    threads = commands.add_parser("threads", parents=[common], help="list threads")
    threads.add_argument("--all", action="store_true", help="include archived threads")
    run = commands.add_parser("run", parents=[common], help="run one turn and stream it here")
    run.add_argument("prompt", nargs="+", help="what to ask (words are joined with spaces)")
    run.add_argument(
        "--provider", choices=("claude", "replay"), help="agent of a new thread (default: claude)"
    )
    run.add_argument(
        "--project",
        metavar="PATH",
        help="project directory of a new thread (default: the current one)",
    )
    run.add_argument(
        "--thread", metavar="ID", help="continue this thread instead of starting a new one"
    )
    run.add_argument("--model", metavar="M", help="model of a new thread (default: the provider's)")
    run.add_argument(
        "--approve",
        choices=("all", "none"),
        help="answer permission requests automatically (default: ask at the terminal; deny without one)",
    )


def _add_common_flags(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        default=default,
        help="state directory of the daemon (T3D_STATE_DIR)",
    )
    parser.add_argument("--host", default=default, help="address the daemon listens on (T3D_HOST)")
    parser.add_argument("--port", default=default, help="port the daemon listens on (T3D_PORT)")
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if default is None else default,
        help="machine-readable output",
    )


def run_ctl(args: argparse.Namespace) -> int:
    """Run the chosen ctl subcommand; return the process exit status."""
    try:
        settings = load_settings(
            {"state_dir": args.state_dir, "host": args.host, "port": args.port}, os.environ
        )
    except ConfigError as exc:
        _err(f"error: {exc}\n")
        return EXIT_USAGE
    handlers: dict[str, Callable[[argparse.Namespace, Endpoint], Awaitable[int]]] = {
        "status": _status,
        "threads": _threads,
        "run": _run,
        "stop": _stop,
        "memory": _memory,
    }
    handler = handlers.get(getattr(args, "ctl_command", None) or "")
    if handler is None:
        _err("error: name a command: t3d ctl status|threads|run|stop|memory (see t3d ctl --help)\n")
        return EXIT_USAGE
    try:
        return trio.run(handler, args, Endpoint.from_settings(settings))
    except BaseException as exc:
        return _exit_status(exc)


def _exit_status(exc: BaseException) -> int:
    """Map an expected failure to its exit status (with its message); re-raise anything else."""
    inner = unwrap_group(exc)
    if isinstance(inner, CtlError):
        _err(f"error: {inner.message}\n")
        return inner.exit_code
    if isinstance(inner, KeyboardInterrupt):
        _err("\n")
        return EXIT_SIGINT
    if isinstance(inner, BrokenPipeError):
        return EXIT_OK  # the reader of our output went away (`| head`)
    raise exc


# -- status and threads -------------------------------------------------------


async def _fetch_shell(endpoint: Endpoint) -> tuple[list[JsonDict], list[JsonDict]]:
    token = read_token(endpoint.token_path)
    shell = await http_get_json(endpoint, "/api/shell", token=token)
    if not isinstance(shell, dict):
        raise CtlError(
            f"{endpoint.url}/api/shell answered {type(shell).__name__}, not an object; is this a t3d daemon?"
        )
    projects = [row for row in shell.get("projects") or [] if isinstance(row, dict)]
    threads = [row for row in shell.get("threads") or [] if isinstance(row, dict)]
    return projects, threads


async def _status(args: argparse.Namespace, endpoint: Endpoint) -> int:
    health = await http_get_json(endpoint, "/api/health")
    if not isinstance(health, dict):
        raise CtlError(
            f"{endpoint.url}/api/health answered {type(health).__name__}, not an object; is this a t3d daemon?"
        )
    projects, threads = await _fetch_shell(endpoint)
    counts = count_threads(threads)
    memory = await _memory_now(endpoint, health)
    if args.json:
        _out(
            orjson.dumps(
                {"url": endpoint.url, "health": health, "projects": len(projects), **counts, "memory_pressure": memory}
            ).decode()
            + "\n"
        )
    else:
        _out(format_status(endpoint.url, health, len(projects), counts) + format_memory(memory))
    return EXIT_OK if health.get("status") == "ok" else 1


async def _memory_now(endpoint: Endpoint, health: JsonDict) -> JsonDict:
    """The current memory-pressure value: health's while the daemon samples, else one
    reading through an opted-in subscription (which the daemon answers with the value)."""
    known = health.get("memory_pressure")
    if isinstance(known, dict) and known.get("sampling"):
        return known
    with trio.move_on_after(MEMORY_WAIT_S):
        try:
            async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
                return await _next_memory_value(rpc, await _subscribe_memory(rpc))
        except CtlError:
            pass  # the rest of the status still stands
    return known if isinstance(known, dict) else {"level": "none", "agents": [], "unavailable": "the daemon did not answer"}


async def _subscribe_memory(rpc: RpcConnection) -> str:
    reply = await rpc.call("subscribe.server", {"memory_pressure": True})
    if not isinstance(reply, dict) or not reply.get("memory_pressure"):
        raise CtlError("this daemon does not report memory pressure; is it an older t3d?")
    return str(reply.get("sub"))


async def _next_memory_value(rpc: RpcConnection, sub: str) -> JsonDict:
    while True:
        note = await rpc.receive_notification()
        if note.get("sub") == sub and note.get("kind") == "memory_pressure" and isinstance(note.get("data"), dict):
            return note["data"]  # type: ignore[no-any-return]


async def _memory(args: argparse.Namespace, endpoint: Endpoint) -> int:
    """`t3d ctl memory`: print the level and the heaviest agents at once and on every change."""
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        sub = await _subscribe_memory(rpc)
        while True:
            value = await _next_memory_value(rpc, sub)
            _out(orjson.dumps(value).decode() + "\n" if args.json else format_memory(value))


async def _stop(args: argparse.Namespace, endpoint: Endpoint) -> int:
    """`t3d ctl stop THREAD [--force]`: interrupt the running turn, or kill the agent."""
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        if args.force:
            result = await rpc.call("thread.force_stop", {"thread_id": args.thread})
        else:
            result = await rpc.call(
                "turn.interrupt", {"thread_id": args.thread, "command_id": new_command_id()}
            )
    if args.json:
        _out(orjson.dumps(result).decode() + "\n")
    elif args.force:
        pid = result.get("pid") if isinstance(result, dict) else None
        how = f"killed its agent (process group {pid})" if pid else "its turn was cancelled"
        _out(f"thread {args.thread}: {how}; the turn ends cancelled (force_stop)\n")
    else:
        _out(f"thread {args.thread}: interrupt requested\n")
    return EXIT_OK


async def _threads(args: argparse.Namespace, endpoint: Endpoint) -> int:
    _, threads = await _fetch_shell(endpoint)
    shown = [thread for thread in threads if args.all or not thread.get("archived_at")]
    if args.json:
        _out(orjson.dumps(shown).decode() + "\n")
    else:
        _out(format_threads_table(shown))
    return EXIT_OK


# -- run ------------------------------------------------------------------------


def _field(result: Any, name: str, method: str) -> Any:
    if not isinstance(result, dict) or result.get(name) is None:
        raise CtlError(
            f"the daemon's reply to {method} has no {name!r}; is it a different t3d version than this client?"
        )
    return result[name]


async def _run(args: argparse.Namespace, endpoint: Endpoint) -> int:
    prompt = " ".join(args.prompt).strip()
    if not prompt:
        raise CtlError('the prompt is empty; say what to do: t3d ctl run "fix the failing test"')
    project, is_dir = await trio.to_thread.run_sync(_project_dir, args.project)
    if args.thread is None and not is_dir:
        raise CtlError(f"--project {project} is not a directory; give the project's directory")
    if args.thread is not None and (args.model or args.provider or args.project):
        _err(
            "note: --provider, --model and --project apply to new threads; ignored with --thread\n"
        )
    token = read_token(endpoint.token_path)
    async with open_rpc(endpoint, token) as rpc:
        hello = await rpc.call("server.hello", {})
        if not isinstance(hello, dict) or hello.get("server") != "t3d":
            raise CtlError(
                f"the server at {endpoint.url} is not a t3d daemon (server.hello said {hello!r})"
            )
        thread_id = args.thread or await _create_thread(rpc, args, project, prompt)
        _err(f"thread {thread_id}\n")
        # Subscribe before starting the turn, so that none of its events is missed.
        sub = _field(
            await rpc.call("subscribe.thread", {"thread_id": thread_id}), "sub", "subscribe.thread"
        )
        started = await rpc.call(
            "turn.start", {"thread_id": thread_id, "text": prompt, "command_id": new_command_id()}
        )
        renderer = TurnRenderer(
            str(_field(started, "turn_id", "turn.start")), json_lines=args.json, cwd=project
        )
        session = _TurnSession(
            rpc,
            thread_id,
            sub,
            renderer,
            approve=args.approve,
            started_status=started.get("status"),
        )
        return await session.run()


def _project_dir(given: str | None) -> tuple[str, bool]:
    """The project directory made absolute (not resolved: the daemon keys projects by path)."""
    path = os.path.abspath(os.path.expanduser(given or os.getcwd()))
    return path, os.path.isdir(path)


async def _create_thread(
    rpc: RpcConnection, args: argparse.Namespace, project: str, prompt: str
) -> str:
    created = await rpc.call("project.create", {"path": project, "command_id": new_command_id()})
    params: JsonDict = {
        "project_id": _field(created, "project_id", "project.create"),
        "provider": args.provider or "claude",
        "title": one_line(prompt, THREAD_TITLE_CHARS),
        "command_id": new_command_id(),
    }
    if args.model:
        params["model"] = args.model
    return str(_field(await rpc.call("thread.create", params), "thread_id", "thread.create"))


class _TurnSession:
    """Streams one turn until it ends; answers its approvals; Ctrl-C interrupts, twice quits."""

    def __init__(
        self,
        rpc: RpcConnection,
        thread_id: str,
        sub: str,
        renderer: TurnRenderer,
        *,
        approve: str | None,
        started_status: Any,
    ) -> None:
        self._rpc = rpc
        self._thread_id = thread_id
        self._sub = sub
        self._renderer = renderer
        self._approve = approve
        self._started_status = started_status if isinstance(started_status, str) else "queued"
        self._interrupt_sent = False
        self._quit = False

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._approver = _Approver(
                self._rpc, nursery, mode=self._approve, to_stderr=self._renderer.json_lines
            )
            await nursery.start(self._watch_sigint)
            await self._stream()
            nursery.cancel_scope.cancel()
        if self._quit:
            self._emit(self._renderer.finish(abandoned=True))
            _err(f"stopped following; the turn goes on in the daemon (thread {self._thread_id})\n")
            return EXIT_SIGINT
        self._emit(self._renderer.finish())
        return self._renderer.exit_code

    async def _stream(self) -> None:
        while not self._renderer.done:
            note = await self._rpc.receive_notification()
            sub, kind, data = note.get("sub"), note.get("kind"), note.get("data")
            if sub is not None and sub != self._sub:
                continue
            if kind == "event" and isinstance(data, dict):
                self._emit(self._renderer.feed_event(data))
            elif kind == "snapshot.chunk" and isinstance(data, dict):
                self._emit(self._renderer.feed_snapshot(data))
            elif kind == "resync" and sub is None:
                # We dropped notifications at our own bound: read the state afresh.
                snapshot = await self._rpc.call("thread.snapshot", {"thread_id": self._thread_id})
                if isinstance(snapshot, dict):
                    self._emit(self._renderer.feed_snapshot(snapshot))
            # A server resync is followed by a fresh snapshot; snapshot.end and
            # synced need nothing: the renderer ignores what it has already shown.

    def _emit(self, rendered: Rendered) -> None:
        _out(rendered.out)
        _err(rendered.err)
        for request_id in rendered.settled:
            self._approver.settle(request_id)
        for prompt in rendered.asks:
            self._approver.ask(prompt)

    async def _watch_sigint(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            task_status.started()  # signals reach the main thread only; nothing to watch
            return
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                status = (self._renderer.turn or {}).get("status", self._started_status)
                if self._interrupt_sent or status == "queued":
                    if status == "queued" and not self._interrupt_sent:
                        _err("\nthe turn is still queued; it stays queued in the daemon\n")
                    self._quit = True
                    self._nursery.cancel_scope.cancel()
                    return
                self._interrupt_sent = True
                self._nursery.start_soon(self._interrupt)

    async def _interrupt(self) -> None:
        _err("\ninterrupting the turn… (Ctrl-C again to stop following it)\n")
        try:
            await self._rpc.call(
                "turn.interrupt", {"thread_id": self._thread_id, "command_id": new_command_id()}
            )
        except RpcError as exc:
            _err(f"could not interrupt: {exc.rpc_message}\n")


class _Approver:
    """Answers the turn's permission requests: by --approve, at the terminal, or by denying.

    One question is on screen at a time. A request settled elsewhere (another
    client, expiry, the turn ending) withdraws its question.
    """

    def __init__(
        self, rpc: RpcConnection, nursery: trio.Nursery, *, mode: str | None, to_stderr: bool
    ) -> None:
        self._rpc = rpc
        self._nursery = nursery
        self._mode = mode
        self._write = _err if to_stderr else _out
        self._scopes: dict[str, trio.CancelScope] = {}
        self._one_at_a_time = trio.Lock()
        self._stdin: _StdinLines | None = None
        if mode is None and sys.stdin is not None and sys.stdin.isatty():
            self._stdin = _StdinLines()
            nursery.start_soon(self._stdin.pump)

    def ask(self, prompt: ApprovalPrompt) -> None:
        scope = trio.CancelScope()
        self._scopes[prompt.request_id] = scope
        self._nursery.start_soon(self._answer, prompt, scope)

    def settle(self, request_id: str) -> None:
        scope = self._scopes.pop(request_id, None)
        if scope is not None:
            scope.cancel()

    async def _answer(self, prompt: ApprovalPrompt, scope: trio.CancelScope) -> None:
        with scope:
            decision, message = await self._decide(prompt)
            params: JsonDict = {
                "request_id": prompt.request_id,
                "decision": decision,
                "command_id": new_command_id(),
            }
            if message:
                params["message"] = message
            try:
                await self._rpc.call("request.respond", params)
            except RpcError as exc:
                _err(f"could not answer {prompt.question!r}: {exc.rpc_message}\n")
        self._scopes.pop(prompt.request_id, None)

    async def _decide(self, prompt: ApprovalPrompt) -> tuple[str, str | None]:
        if self._mode is not None:
            allow = self._mode == "all"
            self._write(f"{prompt.question} {'yes' if allow else 'no'} (--approve {self._mode})\n")
            return ("allow", None) if allow else ("deny", "denied by `t3d ctl run --approve none`")
        if self._stdin is None:
            _err(
                f"{prompt.question} no: stdin is not a terminal; pass --approve all to allow tools\n"
            )
            return "deny", "denied by `t3d ctl run`: no terminal to ask"
        async with self._one_at_a_time:
            self._write(prompt.prompt)
            shown_at = trio.current_time()
            line: str | None = None
            answered = False
            try:
                line = await self._stdin.read_line(since=shown_at)
                answered = True
            finally:
                if not answered or line is None:
                    self._write("\n")  # withdrawn, or end of input: end the prompt's line
        if line is not None and line.strip().lower() in ("y", "yes"):
            return "allow", None
        return "deny", None


def _read_stdin_line() -> str | None:
    try:
        return input()
    except EOFError:
        return None


class _StdinLines:
    """Lines typed at the terminal, read by one worker thread at a time.

    A withdrawn question abandons its read, but the thread stays blocked in
    ``input()``; the line it returns goes to the next question only if it
    was typed after that question appeared.
    """

    def __init__(self) -> None:
        self._wanted = trio.Event()
        self._send, self._recv = trio.open_memory_channel[tuple[float, str]](1)

    async def pump(self) -> None:
        async with self._send:
            while True:
                await self._wanted.wait()
                self._wanted = trio.Event()
                line = await trio.to_thread.run_sync(_read_stdin_line, abandon_on_cancel=True)
                if line is None:
                    return  # end of input: every later question reads None
                await self._send.send((trio.current_time(), line))

    async def read_line(self, *, since: float) -> str | None:
        while True:
            self._wanted.set()
            try:
                at, line = await self._recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None
            if at >= since:
                return line


def _out(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _err(text: str) -> None:
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
