"""Which session driver runs a thread's provider, and how its process is launched.

Theory of operation: the sessions supervisor (`t3d.sessions`) knows only the
`AgentSession` protocol: it hands a session the thread's inbox (`run`), kills
its process group on a force stop (`force_stop`) and reads its process for the
heaviest-agents list (`process`). This module maps each runnable provider onto
its driver and its launch: the binary (and interpreter) before the protocol
arguments, the environment it adds, and the runtime mode in the provider's
terms.

| provider | driver | process |
| --- | --- | --- |
| ``claude`` | `ClaudeSession` | ``--claude-bin`` |
| ``replay`` | `ClaudeSession` | ``replay_fixtures/fake_claude`` playing ``--replay-fixture`` |
| ``codex`` | `CodexSession` | ``--codex-bin app-server`` |
| ``replay-codex`` | `CodexSession` | ``replay_fixtures/fake_codex app-server`` playing ``--replay-codex-fixture`` |

Rules: pure lookups, no I/O; an unknown provider raises `ValueError` (the
domain refuses such threads before any session exists). Only the providers in
`REATTACHABLE` (all four today) have a session that can take a running process
over after a daemon restart (`Reattachable`); a provider added without one
has its agents stopped at a restart, and its threads go on with a new process.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs
import trio

import replay_fixtures
from t3d.config import Settings
from t3d.domain import commands as c
from t3d.domain import events as ev
from t3d.providers.claude.session import ClaudeSession, SessionSpec
from t3d.providers.coalesce import Settling
from t3d.providers.reattach import Reattach
from t3d.spawn.child import Child, Spawner

CLAUDE_PERMISSION_MODES = {
    "approval-required": "default",
    "auto-accept-edits": "acceptEdits",
    "full-access": "bypassPermissions",
}


class AgentSession(Protocol):
    """What the sessions supervisor needs of one thread's provider session."""

    async def run(self, inbox: trio.MemoryReceiveChannel[ev.Effect]) -> None:
        """Serve the thread's effects until told to stop or the inbox closes."""

    async def force_stop(self, grace: float) -> int | None:
        """Kill the provider's process group; its exit status, or None without a process."""

    @property
    def process(self) -> Child | None:
        """The running provider process, if any."""


REATTACHABLE = frozenset({"claude", "replay", "codex", "replay-codex"})


@runtime_checkable
class Reattachable(Protocol):
    """A session that can leave its process running at shutdown and take one over after a
    restart (`t3d.providers.reattach`)."""

    detach_on_cancel: Callable[[], bool]

    async def run(self, inbox: trio.MemoryReceiveChannel[ev.Effect], reattach: Reattach | None = None) -> None: ...

    def detach(self) -> None: ...

    async def force_stop(self, grace: float) -> int | None: ...

    @property
    def process(self) -> Child | None: ...


@attrs.frozen
class Launch:
    """How a thread's provider process is started."""

    argv: tuple[str, ...]  # the binary (and interpreter), before the protocol arguments
    env: Mapping[str, str]  # set in the process's environment
    env_defaults: Mapping[str, str]  # set unless the daemon's environment has them
    permission_mode: str  # the thread's runtime mode in the provider's terms


def launch(provider: str, settings: Settings, runtime_mode: str | None) -> Launch:
    """The launch of ``provider``'s process for a thread in ``runtime_mode``."""
    mode = runtime_mode or "approval-required"
    replay_env = {"T3D_REPLAY_SPEED": repr(settings.replay_speed), "T3D_REPLAY_LOOP": "1"}
    # Recorded edits change real files (checkpoints and diffs see them).
    replay_defaults = {"T3D_REPLAY_APPLY_EDITS": "1"}
    if provider == "claude":
        return Launch((settings.claude_bin,), {}, {}, CLAUDE_PERMISSION_MODES.get(mode, "default"))
    if provider == "replay":
        fixture = settings.replay_fixture or replay_fixtures.DEFAULT_FIXTURE
        return Launch(
            (sys.executable, str(replay_fixtures.FAKE_CLAUDE)),
            {**replay_env, "T3D_REPLAY_FIXTURE": str(fixture)},
            replay_defaults,
            CLAUDE_PERMISSION_MODES.get(mode, "default"),
        )
    if provider == "codex":
        return Launch((settings.codex_bin,), {}, {}, mode)
    if provider == "replay-codex":
        fixture = settings.replay_codex_fixture or replay_fixtures.DEFAULT_CODEX_FIXTURE
        return Launch(
            (sys.executable, str(replay_fixtures.FAKE_CODEX)),
            {**replay_env, "T3D_REPLAY_FIXTURE": str(fixture)},
            replay_defaults,
            mode,
        )
    raise ValueError(f"provider {provider!r} has no session driver")


def open_session(
    spec: SessionSpec,
    write: Callable[[c.Command], Awaitable[object]],
    spawner: Spawner,
    clock: Callable[[], float],
    settings: Settings,
    writes: Settling | None = None,
) -> AgentSession:
    """The session driver for ``spec.provider``; ``writes`` (the session's `WritePipeline`)
    says when what was handed over has committed (streaming coalesces meanwhile)."""
    if spec.provider in ("claude", "replay"):
        return ClaudeSession(spec, write, spawner, clock, writes=writes)
    if spec.provider in ("codex", "replay-codex"):
        # Imported on the first Codex thread's session: a daemon that runs none never loads it.
        from t3d.providers.codex.session import CodexSession

        return CodexSession(spec, write, spawner, clock, retry_timeout=settings.codex_retry_timeout, writes=writes)
    raise ValueError(f"provider {spec.provider!r} has no session driver")
