"""Bundled Claude Code recordings and a fake `claude` CLI that replays them."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent

FAKE_CLAUDE: Path = _HERE / "fake_claude"
"""Executable wrapper; run it like the real `claude` binary."""

FIXTURES_DIR: Path = _HERE / "claude"
"""The Claude Code 2.1.197 recordings, copied unchanged from the shared fixtures."""

DEFAULT_FIXTURE: Path = FIXTURES_DIR / "claude-2.1.197_multiturn_tools.jsonl"
"""The transcript the fake replays when neither --replay-fixture nor T3D_REPLAY_FIXTURE is set."""
