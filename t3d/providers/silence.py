"""The silence watch of a provider session (`--turn-silence-timeout`): a turn whose
provider process sends nothing for the timeout is given up on. Provider-neutral; each
session says what it watches (`Quiet`) and how the process's exit ends the turn
(`SILENT_REASON`, `silence_error`).

Rules:
- Only a running turn with no prompt pending is watched: a turn that waits for the
  user's answer never times out (the session returns None then).
- Quiet is counted from the later of the process's last output and ``since`` (the
  session's last word that asks for one: the turn's start, an answer to a prompt).
- The watch stops the process (TERM, 2 s, KILL) and marks it ``silenced``; the
  process's exit ends the turn ``failed`` (`SILENT_REASON`) and the next turn starts
  a new process. Checked every quarter of the timeout (at most every 30 s), so a turn
  fails between 1 and 1.25 timeouts after its last output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from t3d.providers.output import ProviderOutput
from t3d.spawn.child import Child, stop_child

SILENT_REASON = "provider_silent"


class Watched(Protocol):
    """What the watch needs of a provider process (a `ClaudeProcess`)."""

    silenced: bool

    @property
    def process(self) -> Child: ...
    @property
    def output(self) -> ProviderOutput: ...


@attrs.frozen
class Quiet:
    """A running turn with no prompt pending: its process, id, and since when the
    session has waited for the provider."""

    proc: Watched
    turn_id: str
    since: float


def silence_error(provider: str, timeout: float) -> str:
    """The error of a turn the watch gave up on."""
    return (
        f"{provider} sent nothing for {timeout:g} s, so its process was stopped "
        "(--turn-silence-timeout); start a new turn to continue"
    )


async def watch_silence(
    provider: str,
    silence_timeout: float,
    log: logging.Logger,
    tag: str,
    watched: Callable[[], Quiet | None],
) -> None:
    """Stop the process of a turn that has had no output for ``silence_timeout`` seconds
    (``watched`` is asked what runs; None: nothing to watch). Runs until cancelled."""
    while True:
        await trio.sleep(min(silence_timeout / 4, 30.0))
        quiet = watched()
        if quiet is None or quiet.proc.silenced:
            continue
        proc = quiet.proc
        silent_for = trio.current_time() - max(proc.output.last_output, quiet.since)
        if silent_for < silence_timeout:
            continue
        log.warning(
            "%s: %s sent nothing for %.0f s during turn %s; stopping it", tag, provider, silent_for, quiet.turn_id
        )
        proc.silenced = True
        await stop_child(proc.process, grace=2.0)
