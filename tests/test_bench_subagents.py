"""The benchmark's subagent fixture (bench/subagent_fixture.py) and ``--fixtures``.

The fixture is the plain bench turns with two foreground subagents started in each; the
tests pin that it is what the builder makes, that it keeps the plain turns' lines and timing,
that its lines have recorded shapes, that a real daemon replaying it opens two child threads
per turn and completes them, and that ``--fixtures`` makes configurations A and B.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from harness import new_thread, open_client, run_turn, start_daemon
from test_replay_recordings import project_dir
from test_subagent_threads import check_tree, recorded_subagents

from bench import fixture, subagent_fixture
from bench.__main__ import configurations, described_configurations, fixtures_of, plan_runs
from bench.profiles import PROFILES, SUBAGENT_TURNS_FIXTURE

PATH = fixture.fixture_path(subagent_fixture.SUBAGENTS_NAME)


def test_the_checked_in_subagent_fixture_is_what_the_builder_makes(tmp_path: Path) -> None:
    """replay_fixtures/bench/ holds what ``python -m bench.subagent_fixture`` writes."""
    written = subagent_fixture.write(tmp_path)
    assert len(written) == 3
    for built in written:
        assert built.read_bytes() == (fixture.OUT_DIR / built.name).read_bytes(), f"run python -m bench.subagent_fixture ({built.name})"


def test_the_subagent_turns_keep_the_plain_turns_lines_duration_and_prompts() -> None:
    """Turn for turn, the subagent fixture has the plain fixture's stdout lines, duration,
    first streamed text and prompts; its streamed tool calls are the plain ones plus two
    Agent calls."""
    plain = fixture.read_timings(fixture.fixture_path(fixture.TURNS_NAME))
    subagents = fixture.read_timings(PATH)
    assert len(subagents) == len(plain) == 5
    for p, s in zip(plain, subagents, strict=True):
        assert (s.stdout_lines, s.duration_ms, s.first_item_ms, s.prompts) == (p.stdout_lines, p.duration_ms, p.first_item_ms, p.prompts)
        assert s.tool_calls == p.tool_calls + subagent_fixture.SUBAGENTS_PER_TURN


def test_every_subagent_fixture_line_has_a_recorded_shape() -> None:
    """Each line's kind (host or not, type, subtype, event and delta type, whether it is a
    subagent's) is one the recordings it is built from have."""

    def shapes(text: str) -> set[tuple[Any, ...]]:
        out = set()
        for raw in text.splitlines():
            if not raw.strip():
                continue
            host = raw.startswith(fixture.HOST)
            obj = orjson.loads(raw[len(fixture.HOST) :] if host else raw)
            event = obj.get("event") or {}
            delta = (event.get("delta") or {}).get("type")
            out.add((host, obj.get("type"), obj.get("subtype"), event.get("type"), delta, bool(obj.get("parent_tool_use_id"))))
        return out

    recorded = shapes(fixture.RECORDING.read_text()) | shapes(subagent_fixture.SUBAGENT_RECORDING.read_text())
    built = shapes(PATH.read_text())
    assert built <= recorded, built - recorded


def _subagents_by_turn(workspace: Path) -> list[list[str]]:
    """The Agent calls of each turn of the fixture, in order."""
    turns: list[list[str]] = []
    for raw in PATH.read_text().splitlines():
        if raw.startswith(fixture.HOST) and '"type":"user"' in raw:
            turns.append([])
        elif '"name":"Agent"' in raw and raw.startswith('{"type":"assistant"'):
            turns[-1].extend(b["id"] for b in orjson.loads(raw)["message"]["content"] if b.get("name") == "Agent")
    return turns


async def test_a_daemon_replaying_the_fixture_opens_two_child_threads_per_turn(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Through a real daemon, every turn of the fixture completes with two Agent calls, each
    linked to a child thread of the turn that holds the subagent's prompt, its text and its
    Read call, completed by the call's result."""
    with trio.fail_after(90):
        project = project_dir(tmp_path)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(PATH))
        subs = recorded_subagents(PATH, project)
        by_turn = _subagents_by_turn(project)
        assert [len(calls) for calls in by_turn] == [2] * 5
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            children: set[str] = set()
            for calls in by_turn:
                outcome = await run_turn(client, thread_id, "go")
                assert outcome.turn["status"] == "completed"
                mine = {call: subs[call] for call in calls}
                assert all(len(sub.texts) == 1 and len(sub.tools) == 1 for sub in mine.values())
                snapshots = await check_tree(client, outcome.turn, outcome.items, mine)
                children |= {snapshot["thread"]["id"] for snapshot in snapshots.values()}
            assert len(children) == 10
        daemon.stop()


def _args(**given: object) -> argparse.Namespace:
    defaults: dict[str, object] = {
        "fixtures": None, "compare": None, "env": None, "slow_clients": None, "pollers": None,
        "scrape_interval": None, "profile": "primary", "provider": "claude", "sessions": "3",
        "runs": 2, "window": 10.0, "warmup": 2.0, "db": None, "pin": False, "keep_state": False,
        "restart_every": None, "restart_signal": "TERM",
    }  # fmt: skip
    return argparse.Namespace(**{**defaults, **given})


def test_fixtures_make_configurations_a_and_b_interleaved_or_set_every_run(tmp_path: Path) -> None:
    """--fixtures plain,subagents is two configurations run A B A B (A's Claude sessions on the
    profile's fixture, B's on the subagent one), named so in the report; one kind sets every
    run; no --fixtures is the profile's fixture as before."""
    args = _args(fixtures="plain,subagents")
    assert fixtures_of(args) == {"A": None, "B": SUBAGENT_TURNS_FIXTURE}
    assert list(configurations(args)) == ["A", "B"]
    assert described_configurations(args) == {"A": {"--fixtures": "plain"}, "B": {"--fixtures": "subagents"}}
    specs = plan_runs(args, PROFILES["primary"], tmp_path)
    assert [(s.config, s.claude_fixture) for s in specs] == [
        ("A", fixture.TURNS_NAME), ("B", SUBAGENT_TURNS_FIXTURE), ("A", fixture.TURNS_NAME), ("B", SUBAGENT_TURNS_FIXTURE),
    ]  # fmt: skip
    only = _args(fixtures="subagents")
    assert list(configurations(only)) == ["A"]
    assert [s.claude_fixture for s in plan_runs(only, PROFILES["primary"], tmp_path)] == [SUBAGENT_TURNS_FIXTURE] * 2
    assert described_configurations(_args()) == {"A": {}}
    assert {s.claude_fixture for s in plan_runs(_args(), PROFILES["primary"], tmp_path)} == {fixture.TURNS_NAME}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"fixtures": "nested"}, "plain, subagents or plain,subagents"),
        ({"fixtures": "plain,subagents,plain"}, "plain, subagents or plain,subagents"),
        ({"fixtures": ""}, None),  # empty: the default
        ({"fixtures": "subagents", "provider": "codex"}, "needs --provider claude"),
        ({"fixtures": "plain,subagents", "provider": "mix"}, "needs --provider claude"),
        ({"fixtures": "subagents", "profile": "burst"}, "not burst"),
        ({"fixtures": "plain,subagents", "compare": "T3D_X=1"}, "drop --compare"),
        ({"fixtures": "plain,subagents", "pollers": "http,mcp"}, "drop --compare"),
        ({"fixtures": "plain,subagents", "scrape_interval": "0,1"}, "drop --compare"),
    ],
)
def test_bad_fixtures_are_refused_with_the_fix(given: dict[str, object], message: str | None) -> None:
    """An unknown kind, more than two, subagents with Codex sessions or the burst profile, or
    two fixtures beside another A/B option are refused, naming what to do."""
    if message is None:
        assert fixtures_of(_args(**given)) == {"A": None, "B": None}
        return
    with pytest.raises(SystemExit, match=message):
        fixtures_of(_args(**given))
