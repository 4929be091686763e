"""`t3d ctl run`: one turn from the terminal, streamed as it happens.

The turn's text streams to stdout, tool calls show as one line each, and
permission prompts are answered by ``--approve``, at the terminal, or denied
(`Approver`). The first Ctrl-C interrupts the turn, the second stops following
it (the turn goes on in the daemon).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

import trio

from t3d.config import load_settings
from t3d.ctl.approver import Approver
from t3d.ctl.client import (
    EXIT_SIGINT,
    CtlError,
    Endpoint,
    JsonDict,
    RpcConnection,
    RpcError,
    new_command_id,
    open_rpc,
    read_token,
)
from t3d.ctl.listing import title_from_prompt
from t3d.ctl.render import Rendered, TurnRenderer
from t3d.ctl.shell import project_dir, resolve_thread
from t3d.ctl.terminal import err, out
from t3d.domain.model import RUNNABLE_PROVIDERS

THREAD_TITLE_CHARS = 60
# The project of a replay run given no --project, under the state dir: the demo leaves the
# directory it runs in alone (it would become a project, with checkpoint refs in its repo).
REPLAY_SCRATCH = "replay-demo"
# What the recording reads, so that its recorded edit changes a real file there.
REPLAY_SEED = {"notes.txt": "hello\n"}
# Per replay provider: its scratch project and what its recording's directory held.
REPLAY_SCRATCHES = {
    "replay": (REPLAY_SCRATCH, REPLAY_SEED),
    "replay-codex": ("replay-codex-demo", {"README.md": "hello\n"}),
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    run = commands.add_parser("run", parents=[common], help="run one turn and stream it here")
    run.add_argument("prompt", nargs="+", help="what to ask (words are joined with spaces)")
    run.add_argument(
        "--provider", choices=RUNNABLE_PROVIDERS, help="agent of a new thread (default: claude)"
    )
    run.add_argument(
        "--project",
        metavar="PATH",
        help="project directory of a new thread (default: the current one; for --provider "
        f"replay, a scratch directory <state dir>/{REPLAY_SCRATCH}; for replay-codex, "
        f"<state dir>/{REPLAY_SCRATCHES['replay-codex'][0]})",
    )
    run.add_argument(
        "--thread", metavar="ID", help="continue this thread (its id or a unique prefix) instead of starting a new one"
    )
    run.add_argument("--model", metavar="M", help="model of a new thread (default: the provider's)")
    run.add_argument(
        "--approve",
        choices=("all", "none"),
        help="answer permission requests automatically (default: ask at the terminal; deny without one)",
    )
    run.set_defaults(handler=_run)


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
    if args.thread is None and args.project is None and args.provider in REPLAY_SCRATCHES:
        project, is_dir = await trio.to_thread.run_sync(_replay_scratch, args.state_dir, args.provider)
        err(f"note: the replay runs in a scratch project, {project} (--project DIR runs it elsewhere)\n")
    else:
        project, is_dir = await trio.to_thread.run_sync(project_dir, args.project)
    if args.thread is None and not is_dir:
        raise CtlError(f"--project {project} is not a directory; give the project's directory")
    if args.thread is not None and (args.model or args.provider or args.project):
        err(
            "note: --provider, --model and --project apply to new threads; ignored with --thread\n"
        )
    token = read_token(endpoint.token_path)
    async with open_rpc(endpoint, token) as rpc:
        hello = await rpc.call("server.hello", {})
        if not isinstance(hello, dict) or hello.get("server") != "t3d":
            raise CtlError(
                f"the server at {endpoint.url} is not a t3d daemon (server.hello said {hello!r})"
            )
        thread_id = await resolve_thread(endpoint, token, args.thread) if args.thread else None
        thread_id = thread_id or await _create_thread(rpc, args, project, prompt)
        project_dirs = await _project_dirs(rpc) if args.thread else {}
        err(f"thread {thread_id}\n")
        # Subscribe before starting the turn, so that none of its events is missed.
        sub = _field(
            await rpc.call("subscribe.thread", {"thread_id": thread_id}), "sub", "subscribe.thread"
        )
        started = await rpc.call(
            "turn.start", {"thread_id": thread_id, "text": prompt, "command_id": new_command_id()}
        )
        renderer = TurnRenderer(
            str(_field(started, "turn_id", "turn.start")),
            json_lines=args.json,
            cwd=None if args.thread else project,
            project_dirs=project_dirs,
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


async def _project_dirs(rpc: RpcConnection) -> dict[str, str]:
    """Project id -> directory, so that a continued thread's paths are shown relative to it."""
    listed = await rpc.call("project.list", {})
    projects = listed.get("projects") if isinstance(listed, dict) else None
    return {str(p.get("id")): str(p.get("path")) for p in projects or () if isinstance(p, dict)}


def _replay_scratch(state_dir: str | None, provider: str = "replay") -> tuple[str, bool]:
    """The replay's scratch project under the state dir, made (with the file the recording
    reads) if it is not there yet."""
    scratch, seed = REPLAY_SCRATCHES[provider]
    path = load_settings({"state_dir": state_dir}, os.environ).state_dir / scratch
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name, text in seed.items():
            if not (path / name).exists():
                (path / name).write_text(text)
    except OSError as exc:
        raise CtlError(f"could not make the replay's scratch project {path}: {exc.strerror or exc}; pass --project DIR") from None
    return str(path), True


async def _create_thread(
    rpc: RpcConnection, args: argparse.Namespace, project: str, prompt: str
) -> str:
    created = await rpc.call("project.create", {"path": project, "command_id": new_command_id()})
    params: JsonDict = {
        "project_id": _field(created, "project_id", "project.create"),
        "provider": args.provider or "claude",
        "title": title_from_prompt(prompt, THREAD_TITLE_CHARS),
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
            self._approver = Approver(
                self._rpc, nursery, mode=self._approve, to_stderr=self._renderer.json_lines
            )
            await nursery.start(self._watch_sigint)
            await self._stream()
            nursery.cancel_scope.cancel()
        if self._quit:
            self._emit(self._renderer.finish(abandoned=True))
            err(f"stopped following; the turn goes on in the daemon (thread {self._thread_id})\n")
            return EXIT_SIGINT
        self._emit(self._renderer.finish(interrupted_here=self._interrupt_sent))
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
        out(rendered.out)
        err(rendered.err)
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
                        err("\nthe turn is still queued; it stays queued in the daemon\n")
                    self._quit = True
                    self._nursery.cancel_scope.cancel()
                    return
                self._interrupt_sent = True
                self._nursery.start_soon(self._interrupt)

    async def _interrupt(self) -> None:
        err("\ninterrupting the turn… (Ctrl-C again to stop following it)\n")
        try:
            await self._rpc.call(
                "turn.interrupt", {"thread_id": self._thread_id, "command_id": new_command_id()}
            )
        except RpcError as exc:
            err(f"could not interrupt: {exc.rpc_message}\n")
