"""Opening a provider CLI's prompt as a runtime request, within the domain's bound.

Rules:
- A turn has at most `MAX_PENDING_REQUESTS` prompts pending; the domain refuses the
  next (`DomainError` code ``full``). Such a prompt is not opened: `open_request` logs
  a warning on the session's `LogLimiter` (rate-limited) and returns the deny message
  the session answers its CLI with at once, so the CLI never waits on it and the turn
  carries on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from t3d.domain import commands as c
from t3d.errors import DomainError
from t3d.providers.log_limit import LogLimiter


async def open_request(
    commit: Callable[[c.Command], Awaitable[object]], command: c.OpenRequest, warnings: LogLimiter
) -> str | None:
    """Commit ``command``; None if the prompt is open, else the deny to answer it with."""
    try:
        await commit(command)
    except DomainError as exc:
        if exc.code != "full":
            raise
        warnings.warning(f"denied the provider's prompt {command.request_id} without asking: {exc.message}")
        return f"t3d: {exc.message}; this one was denied without asking"
    return None
