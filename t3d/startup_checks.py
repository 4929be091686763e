"""Checks of the settings that name files, run by `t3d serve` before its loop starts.

`t3d/config.py` stays pure (it never looks at the disk); this module does look, once:

- A provider binary given as a name (the default ``claude``) that is not on ``PATH`` gets a
  warning: the daemon still serves (the replay providers need no binary, and the binary may
  be installed later), and that provider's turns fail with the same fix until it is there.
- A provider binary given as a path that is not a runnable file, or a ``--replay-fixture``
  or ``--replay-codex-fixture`` that is not a readable file, is a `ConfigError`: start-up
  stops with exit status 2.

`PROVIDER_BINARIES` lists, per provider, the setting that names its binary and how to
install it; every check here is generic over it, so a new provider adds one row.
`missing_binary` is the same check for one provider, for a turn that is about to start it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

import attrs

from t3d.config import Settings, setting_names
from t3d.errors import ConfigError


@attrs.frozen
class ProviderBinary:
    provider: str
    setting: str  # the Settings field naming the binary
    install: str  # the command that installs it
    replay: str = "replay"  # the provider that plays its recordings without the binary


PROVIDER_BINARIES: tuple[ProviderBinary, ...] = (
    ProviderBinary("claude", "claude_bin", "npm i -g @anthropic-ai/claude-code"),
    ProviderBinary("codex", "codex_bin", "npm i -g @openai/codex", "replay-codex"),
)


def _not_runnable(path: str) -> str | None:
    """Why the file at ``path`` cannot be run, or None. Blocking."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if not os.access(path, os.X_OK):
        return "not executable"
    return None


def _problem(binary: ProviderBinary, settings: Settings, environ: Mapping[str, str]) -> tuple[bool, str] | None:
    """(given as a path?, what is wrong and the fix) for ``binary``, or None. Blocking."""
    value = str(getattr(settings, binary.setting))
    flag, env = setting_names(binary.setting)
    if "/" in value:
        reason = _not_runnable(value)
        if reason is None:
            return None
        return True, (
            f"{flag} (or {env})={value!r} cannot be run ({reason}); give the path of the "
            f"{binary.provider} CLI, or install it (`{binary.install}`) and leave {flag} unset"
        )
    if shutil.which(value, path=environ.get("PATH", os.defpath)) is not None:
        return None
    return False, (
        f"the {binary.provider} CLI {value!r} is not on PATH; install it (`{binary.install}`) "
        f"or point {flag} (or {env}) at it"
    )


def missing_binary(provider: str, settings: Settings, environ: Mapping[str, str]) -> str | None:
    """What keeps ``provider``'s binary from starting, with the fix; None when nothing does
    (or the provider runs no binary of its own). Blocking: looks at the disk."""
    for binary in PROVIDER_BINARIES:
        if binary.provider == provider:
            problem = _problem(binary, settings, environ)
            return None if problem is None else problem[1]
    return None


def check_settings(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """Check the settings that name files. Returns warnings (the daemon serves anyway);
    raises `ConfigError` for a path that cannot be used. Blocking."""
    warnings = []
    for binary in PROVIDER_BINARIES:
        problem = _problem(binary, settings, environ)
        if problem is None:
            continue
        given_as_path, text = problem
        if given_as_path:
            raise ConfigError(text)
        warnings.append(f"{text}; until then {binary.provider} turns fail (the {binary.replay} provider works without it)")
    for setting in ("replay_fixture", "replay_codex_fixture"):
        fixture = getattr(settings, setting)
        if fixture is not None:
            _check_readable(fixture, setting)
    return warnings


def _check_readable(path: Path, setting: str) -> None:
    flag, env = setting_names(setting)
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        reason = "a directory" if isinstance(exc, IsADirectoryError) else exc.strerror or str(exc)
        raise ConfigError(
            f"{flag} (or {env})={str(path)!r} cannot be read ({reason}); give a readable transcript "
            "file (such as replay_fixtures/claude/*.jsonl or replay_fixtures/codex/*.jsonl), or leave it "
            "unset for the bundled one"
        ) from None
