"""Load profiles (docs/benchmarks.md) and the arithmetic that depends only on them. Pure.

A profile says what the clients do; the session count, warm-up and window come from the
command line (each profile has defaults). Numbers the issue leaves open are chosen here,
once, and printed in every report: PRIMARY's pollers and snapshot client run every 2 s
("every few seconds"), STRESS's every 1 s, and the single-user profile thinks 4 s between
turns so a 5-minute window holds enough turns for a dispatch median.
"""

from __future__ import annotations

import attrs

TURNS_FIXTURE = "claude-2.1.197_bench_turns"
BURST_FIXTURE = "claude-2.1.197_bench_burst"
SUBAGENT_TURNS_FIXTURE = "claude-2.1.197_bench_subagent_turns"  # bench/subagent_fixture.py
# --fixtures: the Claude sessions' turns (None: the profile's own fixture).
FIXTURE_KINDS: dict[str, str | None] = {"plain": None, "subagents": SUBAGENT_TURNS_FIXTURE}
CODEX_FIXTURES = {TURNS_FIXTURE: "codex-0.171.0_bench_turns", BURST_FIXTURE: "codex-0.171.0_bench_burst"}
# --provider: the providers the sessions' threads use, in turn (a mix alternates).
PROVIDER_MIXES = {"claude": ("replay",), "codex": ("replay-codex",), "mix": ("replay", "replay-codex")}


@attrs.frozen
class Profile:
    name: str
    think_s: float
    # One UI subscriber per this many sessions (0: none); each follows one thread and
    # switches to another every ``switch_s`` (0: never).
    sessions_per_subscriber: int
    switch_s: float
    # One approval-bot poller per this many sessions (0: none; the sessions answer their
    # own prompts then, as a user at the UI would). Each poll is GET /api/requests/pending
    # and GET /api/shell.
    sessions_per_poller: int
    poll_s: float
    # One client polling the largest thread's full snapshot (0: none).
    snapshot_poll_s: float
    fixture: str
    sample_s: float  # /proc sampling period of the daemon and its processes
    sessions: int
    window_s: float
    warmup_s: float
    burst: bool = False

    @property
    def codex_fixture(self) -> str:
        """The Codex equivalent of ``fixture`` (bench/codex_fixture.py)."""
        return CODEX_FIXTURES[self.fixture]

    def subscribers(self, sessions: int) -> int:
        return _groups(sessions, self.sessions_per_subscriber)

    def pollers(self, sessions: int) -> int:
        return _groups(sessions, self.sessions_per_poller)

    def describe(self) -> str:
        if self.burst:
            return "every thread starts one turn at the same moment; a 5-delta text answer"
        parts = [f"think {self.think_s:g} s"]
        if self.sessions_per_subscriber:
            every = f", switching every {self.switch_s:g} s" if self.switch_s else ""
            parts.append(f"1 UI subscriber per {self.sessions_per_subscriber} sessions{every}")
        if self.sessions_per_poller:
            parts.append(
                f"1 approval poller per {self.sessions_per_poller} sessions every {self.poll_s:g} s"
            )
        else:
            parts.append("no pollers (sessions answer their own prompts)")
        if self.snapshot_poll_s:
            parts.append(f"largest-thread snapshot every {self.snapshot_poll_s:g} s")
        return "; ".join(parts)


def session_providers(provider: str, sessions: int) -> list[str]:
    """The provider of each session's thread for ``--provider`` (claude, codex or mix)."""
    mix = PROVIDER_MIXES[provider]
    return [mix[i % len(mix)] for i in range(sessions)]


def _groups(sessions: int, per: int) -> int:
    return 0 if per <= 0 else max(1, -(-sessions // per))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("primary", 60.0, 10, 300.0, 4, 2.0, 2.0, TURNS_FIXTURE, 1.0, 50, 300.0, 60.0),
        Profile("stress", 1.0, 1, 30.0, 4, 1.0, 1.0, TURNS_FIXTURE, 1.0, 50, 300.0, 60.0),
        Profile("single", 4.0, 1, 0.0, 0, 0.0, 0.0, TURNS_FIXTURE, 1.0, 1, 300.0, 30.0),
        Profile("burst", 0.0, 0, 0.0, 0, 0.0, 0.0, BURST_FIXTURE, 0.1, 10, 0.0, 0.0, burst=True),
        # A few sessions for the test suite: every kind of client, a short window.
        Profile("smoke", 1.0, 2, 5.0, 2, 1.0, 1.0, TURNS_FIXTURE, 0.5, 4, 12.0, 4.0),
    )
}


def physical_limit(sessions: int, window_s: float, think_s: float, turn_s: float) -> float:
    """Turns the profile could complete at most: sessions x window / (think + turn)."""
    return sessions * window_s / (think_s + turn_s)


def start_offsets(sessions: int, think_s: float, turn_s: float, warmup_s: float) -> list[float]:
    """When each session starts its first turn: spread evenly over one cycle (think + turn),
    at most the warm-up, so the sessions do not turn in lock-step."""
    spread = min(think_s + turn_s, warmup_s) if warmup_s > 0 else 0.0
    return [spread * i / sessions for i in range(sessions)]
