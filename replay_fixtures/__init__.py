"""Bundled Claude Code and Codex recordings, and fake `claude` and `codex` CLIs that replay them."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

FAKE_CLAUDE: Path = _HERE / "fake_claude"
"""Executable wrapper; run it like the real `claude` binary."""

FIXTURES_DIR: Path = _HERE / "claude"
"""The Claude Code 2.1.197 recordings, copied unchanged from the shared fixtures."""

DEFAULT_FIXTURE: Path = FIXTURES_DIR / "claude-2.1.197_multiturn_tools.jsonl"
"""The transcript the fake replays when neither --replay-fixture nor T3D_REPLAY_FIXTURE is set."""

FAKE_CODEX: Path = _HERE / "fake_codex"
"""Executable wrapper; run it like the real `codex` binary (`fake_codex app-server`)."""

CODEX_FIXTURES_DIR: Path = _HERE / "codex"
"""The Codex 0.171.0 app-server recordings, copied unchanged from the shared fixtures."""

DEFAULT_CODEX_FIXTURE: Path = CODEX_FIXTURES_DIR / "codex-0.171.0_app-server_multiturn.jsonl"
"""The transcript the fake `codex` replays when neither --replay-fixture nor T3D_REPLAY_FIXTURE is set."""
