"""`CodexPeer`: t3d's end of the JSON-RPC conversation with one ``codex app-server``
process: the ids of its requests, who waits for which answer, and its bounded writes.

Theory of operation: the session's reader hands every response it parses to
`CodexPeer.on_response`, which wakes the `CodexPeer.call` waiting for it; the
session's other writes (notifications, answers to Codex's requests) go through
`CodexPeer.send`. There is one peer per process, so a process on its way out
(stopped for being idle) answers only its own calls.

A peer that takes over a process a previous daemon left running (`Reattach`) counts
on from that daemon's last id (``next_id``, from the spawner's meta) and from every
id a response shows (`ClientCalls.skip_past`): no id is used twice on one process,
so no answer to the previous daemon's requests is taken for one of this daemon's.
Such an answer settles nothing here; the session reads what it needs of it (the
turn/start of the turn it takes over) from the replay.

Rules:
- Every call waits at most `CALL_TIMEOUT_S` for its answer; once the process has
  gone (`close`), every call in flight fails and new ones fail at once.
- A write waits at most `SEND_TIMEOUT_S`: a process that does not read its input
  is hung.
- An error answer nobody waits for is logged (rate-limited: the session's `LogLimiter`
  for notes), never raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from t3d.errors import ProviderError
from t3d.providers.claude.process import ClaudeProcess as CliProcess
from t3d.providers.codex import events as ce
from t3d.providers.codex.encode import encode_request
from t3d.providers.codex.protocol import ClientCalls
from t3d.providers.log_limit import LogLimiter

# A provider that takes no input for this long is treated as hung.
SEND_TIMEOUT_S = 30.0
# How long a request to Codex (initialize, thread/start, turn/start) may go unanswered.
CALL_TIMEOUT_S = 60.0

BeforeSend = Callable[[int], Awaitable[None]]


class CodexRefused(ProviderError):
    """Codex answered a request with a JSON-RPC error; the message is Codex's."""

    def __init__(self, method: str, message: str) -> None:
        super().__init__(message)
        self.method = method
        self.message = message


@attrs.define
class Call:
    """A request waiting for its response."""

    method: str
    done: trio.Event = attrs.Factory(trio.Event)
    result: Any = None
    error: ProviderError | None = None


class CodexPeer:
    def __init__(self, proc: CliProcess, provider: str, notes: LogLimiter, *, next_id: int = 1) -> None:
        self.proc = proc
        self.provider = provider
        self._notes = notes
        self.calls = ClientCalls(next_id)
        self._waiting: dict[ce.RequestId, Call] = {}
        self._gone: ProviderError | None = None
        # The Codex thread this process serves, once opened (or known from the meta).
        self.thread_id: str | None = None
        # The handshake is done and the spawner knows the Codex thread: the next daemon
        # can take the process over without a new handshake.
        self.ready = False
        # The id of the last turn/start sent on this process (its answer names Codex's turn).
        self.turn_request_id: int | None = None

    async def send(self, line: bytes) -> None:
        if self._gone is not None:
            raise ProviderError(f"{self.provider} is not running")
        try:
            with trio.fail_after(SEND_TIMEOUT_S):
                await self.proc.process.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ProviderError(
                f"{self.provider} is not accepting input (its process has exited)"
            ) from exc
        except trio.TooSlowError as exc:
            raise ProviderError(
                f"{self.provider} has not read its input for {SEND_TIMEOUT_S:g} s; "
                "it looks hung: archive the thread or start a new turn to restart it"
            ) from exc

    async def send_quietly(self, line: bytes) -> None:
        """Send, ignoring a process that is going away (its exit reports what matters)."""
        with contextlib.suppress(ProviderError):
            await self.send(line)

    async def notify(self, request_id: int, method: str, params: ce.JsonObject) -> None:
        """Send a request whose answer nobody waits for (``turn/interrupt``)."""
        await self.send_quietly(encode_request(request_id, method, params))

    async def call(
        self, method: str, params: ce.JsonObject, *, before_send: BeforeSend | None = None
    ) -> Any:
        """Send a request and wait (bounded) for its response; raises `CodexRefused` for an
        error response and `ProviderError` when the process goes or never answers.
        ``before_send`` is awaited with the request's id just before it is written, and
        the two are shielded together (what it records about the request is then true)."""
        if self._gone is not None:
            raise ProviderError(f"{self.provider} is not running")
        request_id = self.calls.start(method)
        call = Call(method)
        self._waiting[request_id] = call
        try:
            with trio.CancelScope(shield=before_send is not None):
                if before_send is not None:
                    await before_send(request_id)
                await self.send(encode_request(request_id, method, params))
            with trio.fail_after(CALL_TIMEOUT_S):
                await call.done.wait()
        except trio.TooSlowError:
            raise ProviderError(
                f"{self.provider} did not answer {method} within {CALL_TIMEOUT_S:g} s; "
                "start a new turn to restart it"
            ) from None
        finally:
            self._waiting.pop(request_id, None)
            self.calls.settle(request_id)
        if call.error is not None:
            raise call.error
        return call.result

    def on_response(self, event: ce.Response | ce.ErrorResponse) -> bool:
        """Hand a response to the call waiting for it; False when none waits (an answer to
        a previous daemon's request, or one that came too late)."""
        method = self.calls.settle(event.id)
        self.calls.skip_past(event.id)
        call = self._waiting.get(event.id) if event.id is not None else None
        if call is None:
            if isinstance(event, ce.ErrorResponse):
                self._notes.warning(f"Codex refused {method or 'a request'}: {event.message}")
            return False
        if isinstance(event, ce.ErrorResponse):
            call.error = CodexRefused(call.method, event.message)
        else:
            call.result = event.result
        call.done.set()
        return True

    def close(self, code: int) -> None:
        """The process has exited: every call in flight fails, and so does every later one."""
        gone = ProviderError(f"{self.provider} exited with status {code}")
        self._gone = gone
        for call in self._waiting.values():
            call.error = gone
            call.done.set()
        self.calls.forget()
