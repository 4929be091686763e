"""A replay turn through the real daemon, end to end."""

from __future__ import annotations

from pathlib import Path

import trio
from harness import new_thread, open_client, run_turn, start_daemon


async def test_a_replay_turn_streams_and_completes(tmp_path: Path, nursery: trio.Nursery) -> None:
    with trio.fail_after(20):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path)
            outcome = await run_turn(client, thread_id, "Please READ notes.txt")
        assert outcome.turn["status"] == "completed"
        assert outcome.assistant_text == ["I'll read the file.", "Done. The tool returned: 1\thello | 2\t"]
        daemon.stop()
