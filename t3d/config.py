"""Settings: command-line flags over ``T3D_*`` environment variables over defaults.

Pure: `load_settings(flags, environ)` never touches the disk. Every bad value
raises `ConfigError` naming the setting, the bad value and what is allowed;
`t3d serve` turns that into exit status 2.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from t3d.errors import ConfigError

T = TypeVar("T")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3774


@attrs.frozen
class Settings:
    state_dir: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # Reader threads for SQLite reads.
    sqlite_reader_pool: int = 4
    # The `claude` binary for the claude provider.
    claude_bin: str = "claude"
    # The `codex` binary for the codex provider (run as `codex app-server`).
    codex_bin: str = "codex"
    # Seconds a Codex turn may do nothing but retry (reconnecting) before it is stopped
    # and failed with Codex's last message; 0 = as long as Codex retries.
    codex_retry_timeout: float = 60.0
    # Transcript the replay provider plays; None = the bundled multi-turn one.
    replay_fixture: Path | None = None
    # Transcript the replay-codex provider plays; None = the bundled multi-turn one.
    replay_codex_fixture: Path | None = None
    # Replay timing scale (2 = twice as fast, 0 = no delays).
    replay_speed: float = 1.0
    # Seconds a provider gets to honour an interrupt before it is stopped.
    interrupt_timeout: float = 10.0
    # Seconds an idle provider process is kept (0 = forever); the next turn resumes it.
    provider_idle_timeout: float = 1800.0
    # Who starts processes: the spawner sidecar (auto, required) or the daemon itself (off).
    process_spawner: str = "auto"
    # Pool sizes in the spawner; None = its defaults (git max(8, min(32, cpus // 4)), forge 4).
    spawner_git_pool: int | None = None
    spawner_forge_pool: int | None = None
    # Loop-lag mark (ms, p99) at which turn starts are held back; 0 = the gate is off.
    effect_admission_delay_ms: int = 40
    # Turns running at once across the daemon; 0 = no cap.
    max_active_turns: int = 0
    # The loop monitor (lag samples every 10 ms); off only to measure its own cost.
    loop_monitor: str = "on"
    # Per-turn git checkpoints (t3d/git); off only to measure their cost.
    checkpoints: str = "on"
    # Every thread's workspace status (branch, ahead/behind, changed files) kept in memory
    # and pushed to subscribers (t3d/git/workspaces.py); off only to measure its cost.
    workspace_status: str = "on"
    # Seconds between looks at the files watched workspaces depend on (a few stat calls each).
    workspace_status_interval: float = 2.0
    # Pull requests of branches on GitHub, GitLab or Gitea through gh, glab or tea.
    pull_requests: str = "on"
    # Live events projected and encoded once for all subscribers, and fresh snapshots
    # shared per wave; false projects per subscriber (only to measure against).
    live_encode_once: bool = True
    # Provider updates of all sessions share transactions when already queued together;
    # false commits each update alone (only to measure against).
    provider_commit_batching: bool = True
    # Milliseconds a batch of provider updates may wait for more to join it, counted from
    # the last batch's commit: under load transactions come at most this often; an update
    # after a quiet spell commits at once (0: only what is already queued together).
    provider_commit_interval_ms: int = 20
    # full: every commit survives a power loss (an fsync per transaction, on the writer
    # thread); normal: the last commits before a power loss may be lost (README "Durability").
    sqlite_synchronous: str = "full"
    # Milliseconds a write waits for another process's lock on the database before it
    # fails as "locked by another process" (provider writes then retry; README).
    sqlite_busy_timeout_ms: int = 5000
    # Root under which proc/pressure/memory and the agents' cgroup files are read
    # (tests and demos point it at fixture files).
    psi_root: Path = Path("/")
    # Seconds between memory-pressure readings, while someone wants them.
    pressure_interval: float = 5.0
    # Hold new turn starts as queued (memory_pressure) while the memory pressure is severe.
    # On, each turn start takes a reading when nobody listens, and turns held for memory
    # keep the sampler running until they start.
    pressure_admission: str = "on"
    # Run providers in their own systemd scope under t3d-agents.slice when systemd
    # works (auto), or never (off).
    agent_scopes: str = "auto"
    # Force stop: seconds between SIGTERM and SIGKILL to the provider's process group.
    force_stop_grace: float = 5.0
    # Retention (t3d/store/pruner.py): on prunes superseded events by age; off keeps them
    # (deleted threads' events still go), only to measure against.
    retention: str = "on"
    # Seconds a superseded item snapshot (item.updated) is kept.
    retention_item_snapshots_age: float = 3600.0
    # Seconds a superseded thread-state event (thread, turn, request, session, checkpoint) is kept.
    retention_state_events_age: float = 7 * 86400.0
    # Seconds between retention passes.
    retention_interval: float = 60.0
    # The share of the writer's time a retention pass may take (it pauses between steps).
    retention_duty: float = 0.25
    # Seconds agents keep running under the spawner for a daemon to come back and
    # reattach after this one went away without stopping them; 0 = they stop with it.
    agent_reattach_window: float = 300.0
    # Seconds a turn's provider may send nothing (no request pending) before the turn
    # is failed and the process stopped; 0 = never.
    turn_silence_timeout: float = 1800.0
    log_level: str = "info"
    # text: one line per record; json: one JSON object per line (t3d/observe/logs.py).
    log_format: str = "text"
    # A loop stall at least this long (seconds) logs one record with what the daemon was doing.
    loop_stall_threshold: float = 1.0
    # none: GET /metrics needs the token like every route; loopback: scrapers connecting
    # from a loopback address need none.
    metrics_open: str = "none"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "t3d.sqlite"

    @property
    def spawner_socket(self) -> Path:
        return self.state_dir / "spawner.sock"

    @property
    def token_path(self) -> Path:
        return self.state_dir / "auth" / "token"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def default_state_dir(environ: Mapping[str, str]) -> Path:
    xdg = environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "t3d"
    home = environ.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "state" / "t3d"


def _number_in(kind: Callable[[str], T], low: T, high: T, noun: str) -> Callable[[str, str], T]:
    """A parser for a number of ``kind`` (int or float) between ``low`` and ``high``."""
    allowed = f"use {noun} from {low:g} to {high:g}"

    def parse(name: str, raw: str) -> T:
        try:
            value = kind(raw)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"{name}={raw!r} is not {what}; {allowed}") from None
        if not low <= value <= high:  # type: ignore[operator]
            raise ConfigError(f"{name}={raw!r} is out of range; {allowed}")
        return value

    return parse


def _int_in(low: int, high: int) -> Callable[[str, str], int]:
    return _number_in(int, low, high, "a whole number")


def _float_in(low: float, high: float) -> Callable[[str, str], float]:
    return _number_in(float, low, high, "a number")


def _host(name: str, raw: str) -> str:
    if raw == "localhost":
        return raw
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not an IP address; use 127.0.0.1 (the default), ::1, localhost, "
            "or another address of this host (binding beyond loopback exposes the API to the network)"
        ) from None
    return raw


def _abs_path(name: str, raw: str) -> Path:
    if not raw.strip():
        raise ConfigError(f"{name} is empty; give a directory path")
    try:
        path = Path(raw).expanduser()
    except RuntimeError:  # "~user" for a user this host does not know
        raise ConfigError(
            f"{name}={raw!r} starts with a ~ whose home directory is unknown; give an absolute path"
        ) from None
    return path.absolute()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(low: float, high: float) -> Callable[[str, str], float]:
    """Seconds, given as a number or with a unit: ``90``, ``90s``, ``5m``, ``1h``, ``7d``."""

    def show(seconds: float) -> str:
        for unit in ("d", "h", "m"):
            if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
                return f"{seconds / _UNITS[unit]:g}{unit}"
        return f"{seconds:g}s"

    allowed = f"use a duration from {show(low)} to {show(high)}, in seconds or with a unit (90, 90s, 5m, 1h, 7d)"

    def parse(name: str, raw: str) -> float:
        text = raw.strip().lower()
        scale = _UNITS.get(text[-1:])
        try:
            value = float(text[:-1] if scale else text) * (scale or 1.0)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a duration; {allowed}") from None
        if not low <= value <= high:
            raise ConfigError(f"{name}={raw!r} is out of range; {allowed}")
        return value

    return parse


def _text(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{name} is empty; give a value")
    return raw


def _program(name: str, raw: str) -> str:
    """A program: a bare name is looked up on PATH when it runs; a path is made absolute here,
    since providers run in their thread's directory. Whether it runs is checked at start-up
    (t3d/startup_checks.py), not here: this module never looks at the disk."""
    value = _text(name, raw)
    if "/" not in value and not value.startswith("~"):
        return value
    return str(_abs_path(name, value))


def _admission_mark(name: str, raw: str) -> int:
    value = _int_in(0, 60000)(name, raw)
    if 0 < value < 30:
        raise ConfigError(f"{name}={raw!r} is out of range; use 0 (off) or 30 to 60000")
    return value


def _true_false(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{name}={raw!r} is not allowed; use true or false")
    return value == "true"


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw.lower() not in allowed:
            raise ConfigError(f"{name}={raw!r} is not allowed; use one of {', '.join(allowed)}")
        return raw.lower()

    return parse


# setting name -> (flag attribute, environment variable, parser)
_SETTINGS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "state_dir": ("T3D_STATE_DIR", _abs_path),
    "host": ("T3D_HOST", _host),
    "port": ("T3D_PORT", _int_in(0, 65535)),
    "sqlite_reader_pool": ("T3D_SQLITE_READER_POOL", _int_in(1, 32)),
    "claude_bin": ("T3D_CLAUDE_BIN", _program),
    "codex_bin": ("T3D_CODEX_BIN", _program),
    "codex_retry_timeout": ("T3D_CODEX_RETRY_TIMEOUT", _float_in(0.0, 3600.0)),
    "replay_fixture": ("T3D_REPLAY_FIXTURE", _abs_path),
    "replay_codex_fixture": ("T3D_REPLAY_CODEX_FIXTURE", _abs_path),
    "replay_speed": ("T3D_REPLAY_SPEED", _float_in(0.0, 1000.0)),
    "interrupt_timeout": ("T3D_INTERRUPT_TIMEOUT", _float_in(0.1, 600.0)),
    "provider_idle_timeout": ("T3D_PROVIDER_IDLE_TIMEOUT", _float_in(0.0, 604800.0)),
    "process_spawner": ("T3D_PROCESS_SPAWNER", _choice("auto", "required", "off")),
    "spawner_git_pool": ("T3D_SPAWNER_GIT_POOL", _int_in(1, 256)),
    "spawner_forge_pool": ("T3D_SPAWNER_FORGE_POOL", _int_in(1, 64)),
    "effect_admission_delay_ms": ("T3D_EFFECT_ADMISSION_DELAY_MS", _admission_mark),
    "max_active_turns": ("T3D_MAX_ACTIVE_TURNS", _int_in(0, 100000)),
    "loop_monitor": ("T3D_LOOP_MONITOR", _choice("on", "off")),
    "checkpoints": ("T3D_CHECKPOINTS", _choice("on", "off")),
    "workspace_status": ("T3D_WORKSPACE_STATUS", _choice("on", "off")),
    "workspace_status_interval": ("T3D_WORKSPACE_STATUS_INTERVAL", _float_in(0.1, 60.0)),
    "pull_requests": ("T3D_PULL_REQUESTS", _choice("on", "off")),
    "live_encode_once": ("T3D_LIVE_ENCODE_ONCE", _true_false),
    "provider_commit_batching": ("T3D_PROVIDER_COMMIT_BATCHING", _true_false),
    "provider_commit_interval_ms": ("T3D_PROVIDER_COMMIT_INTERVAL_MS", _int_in(0, 1000)),
    "sqlite_synchronous": ("T3D_SQLITE_SYNCHRONOUS", _choice("full", "normal")),
    "sqlite_busy_timeout_ms": ("T3D_SQLITE_BUSY_TIMEOUT_MS", _int_in(0, 600_000)),
    "psi_root": ("T3D_PSI_ROOT", _abs_path),
    "pressure_interval": ("T3D_PRESSURE_INTERVAL", _float_in(0.05, 60.0)),
    "pressure_admission": ("T3D_PRESSURE_ADMISSION", _choice("on", "off")),
    "agent_scopes": ("T3D_AGENT_SCOPES", _choice("auto", "off")),
    "force_stop_grace": ("T3D_FORCE_STOP_GRACE", _float_in(0.1, 60.0)),
    "retention": ("T3D_RETENTION", _choice("on", "off")),
    "retention_item_snapshots_age": ("T3D_RETENTION_ITEM_SNAPSHOTS_AGE", _duration(0.0, 30 * 86400.0)),
    "retention_state_events_age": ("T3D_RETENTION_STATE_EVENTS_AGE", _duration(0.0, 365 * 86400.0)),
    "retention_interval": ("T3D_RETENTION_INTERVAL", _duration(1.0, 86400.0)),
    "retention_duty": ("T3D_RETENTION_DUTY", _float_in(0.05, 1.0)),
    "agent_reattach_window": ("T3D_AGENT_REATTACH_WINDOW", _float_in(0.0, 86400.0)),
    "turn_silence_timeout": ("T3D_TURN_SILENCE_TIMEOUT", _float_in(0.0, 604800.0)),
    "log_level": ("T3D_LOG_LEVEL", _choice("debug", "info", "warning", "error")),
    "log_format": ("T3D_LOG_FORMAT", _choice("text", "json")),
    "loop_stall_threshold": ("T3D_LOOP_STALL_THRESHOLD", _float_in(0.05, 600.0)),
    "metrics_open": ("T3D_METRICS_OPEN", _choice("none", "loopback")),
}


def load_settings(flags: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
    """Resolve every setting. ``flags`` holds parsed CLI values (None = not given)."""
    values: dict[str, Any] = {}
    for field, (env_name, parse) in _SETTINGS.items():
        flag = flags.get(field)
        if flag is not None:
            values[field] = parse("--" + field.replace("_", "-"), str(flag))
        elif env_name in environ:
            values[field] = parse(env_name, environ[env_name])
    values.setdefault("state_dir", default_state_dir(environ))
    return Settings(**values)


def setting_names(field: str) -> tuple[str, str]:
    """The flag and the environment variable of the setting ``field`` (``--claude-bin``,
    ``T3D_CLAUDE_BIN``)."""
    return "--" + field.replace("_", "-"), _SETTINGS[field][0]


def environment_help() -> str:
    return ", ".join(env for env, _ in _SETTINGS.values())
