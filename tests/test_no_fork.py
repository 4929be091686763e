"""The daemon never forks: after start-up every process comes from the spawner.

`t3d serve` runs under an audit hook (tests/fixtures/audited_t3d.py) that
records every process creation in the daemon process. Real turns run on the
replay provider; afterwards the record must hold nothing after start-up (where
the daemon started the spawner), and the provider processes must be the
spawner's children.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio
from harness import new_thread, run_turn
from served import base_env, open_ws, provider_pids, serve

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


async def test_the_daemon_creates_no_process_after_start_up(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    env = base_env(T3D_AUDIT_LOG=str(audit))
    launcher = (str(FIXTURES / "audited_t3d.py"),)
    with trio.fail_after(60):
        # A reattach window of 0: SIGTERM takes the agents and the spawner along.
        async with serve(tmp_path / "state", "--agent-reattach-window", "0", env=env, launcher=launcher) as daemon:
            at_start = audit.read_text().splitlines()
            async with open_ws(daemon) as client:
                threads = [await new_thread(client, tmp_path) for _ in range(3)]
                for thread_id in threads:
                    for text in ("Please READ notes.txt", "Now EDIT notes.txt"):
                        assert (await run_turn(client, thread_id, text)).turn["status"] == "completed"
                pids = await provider_pids(daemon)
                spawners = {parent_pid(pid) for pid in pids}
                spawner_parents = {parent_pid(pid) for pid in spawners}
            after = audit.read_text().splitlines()
            daemon_pid = daemon.process.pid
            daemon.process.send_signal(signal.SIGTERM)
            assert await daemon.process.wait() == 0
    started = [json.loads(line)["args"] for line in at_start]
    # Start-up: the spawner, and trio's import-time `ldconfig -p` (ctypes.util.find_library).
    assert [a for a in started if "'-m', 'spawner'" in a] != []
    assert [a for a in started if "'-m', 'spawner'" not in a and "ldconfig" not in a] == []
    assert after == at_start, f"the daemon created processes after start-up: {after[len(at_start):]}"
    assert len(pids) == 3
    [spawner_pid] = spawners
    assert spawner_pid != daemon_pid and spawner_parents == {daemon_pid}
    assert not (tmp_path / "state" / "spawner.sock").exists()
