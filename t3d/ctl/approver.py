"""Answering permission prompts from a terminal, for `t3d ctl run` and `t3d ctl attach`.

`Approver` answers each question a renderer asks: by ``--approve all|none``, by asking at
the terminal, and without one by denying (``run``: nobody else is watching its turn) or
by leaving the request pending for another client (``attach``: it only looks on).
`watch_sigint` hands each Ctrl-C to a callback instead of raising KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

import trio

from t3d.ctl.client import JsonDict, RpcConnection, RpcError, new_command_id
from t3d.ctl.render import ApprovalPrompt
from t3d.ctl.terminal import StdinLines, err, out


class Approver:
    """Answers the turn's permission requests: by --approve, at the terminal, or (without a
    terminal) by denying them, or, with ``leave_without_terminal``, not at all.

    One question is on screen at a time. A request settled elsewhere (another
    client, expiry, the turn ending) withdraws its question.
    """

    def __init__(
        self,
        rpc: RpcConnection,
        nursery: trio.Nursery,
        *,
        mode: str | None,
        to_stderr: bool,
        command: str = "run",
        leave_without_terminal: bool = False,
    ) -> None:
        self._rpc = rpc
        self._nursery = nursery
        self._mode = mode
        self._command = command
        self._leave = leave_without_terminal
        self._write = err if to_stderr else out
        self._scopes: dict[str, trio.CancelScope] = {}
        self._one_at_a_time = trio.Lock()
        self._stdin: StdinLines | None = None
        if mode is None and sys.stdin is not None and sys.stdin.isatty():
            self._stdin = StdinLines()
            nursery.start_soon(self._stdin.pump)

    def ask(self, prompt: ApprovalPrompt) -> None:
        if self._mode is None and self._stdin is None and self._leave:
            err(
                f"{prompt.question} (left pending: stdin is not a terminal; answer it from a terminal "
                f"with `t3d ctl {self._command}`, or pass --approve all|none)\n"
            )
            return
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
                err(f"could not answer {prompt.question!r}: {exc.rpc_message}\n")
        self._scopes.pop(prompt.request_id, None)

    async def _decide(self, prompt: ApprovalPrompt) -> tuple[str, str | None]:
        if self._mode is not None:
            allow = self._mode == "all"
            self._write(f"{prompt.question} {'yes' if allow else 'no'} (--approve {self._mode})\n")
            return ("allow", None) if allow else ("deny", f"denied by `t3d ctl {self._command} --approve none`")
        if self._stdin is None:
            err(
                f"{prompt.question} no: stdin is not a terminal; pass --approve all to allow tools\n"
            )
            return "deny", f"denied by `t3d ctl {self._command}`: no terminal to ask"
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


async def watch_sigint(
    on_sigint: Callable[[], None], task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Call ``on_sigint`` for each Ctrl-C until cancelled (off the main thread, where no
    signal arrives, return at once)."""
    if threading.current_thread() is not threading.main_thread():
        task_status.started()
        return
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            on_sigint()
