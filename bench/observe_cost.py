"""What observability costs per committed event: ``python -m bench.observe_cost [--events N]``.

Times `CommitTally.on_commit` (the `store.on_commit` listener behind the turn counters,
turn durations, events by kind and the turn and agent log lines) over batches shaped like
a provider's stream: per turn, its start (thread and turn updates, a session update),
item updates in batches of 8, and its end, with the turn and agent log lines going to a
handler that drops them (formatting included). Prints microseconds per event, the mean
over the run and the best of five runs. Pure CPU on this process: no daemon, no disk.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from t3d.domain.model import ProviderSession, Thread, Turn, TurnItem
from t3d.observe.tally import CommitTally
from t3d.store.commit import Committed, StoredEvent

ITEMS_PER_TURN = 40
BATCH = 8


def batches(turns: int) -> list[Committed]:
    """The committed batches of ``turns`` turns on 50 threads."""
    out, seq = [], 0

    def event(kind: str, entity: object, thread_id: str) -> StoredEvent:
        nonlocal seq
        seq += 1
        return StoredEvent(seq, kind, thread_id, entity, b"{}", 0.0)  # type: ignore[arg-type]

    for n in range(turns):
        thread_id, turn_id = f"t{n % 50}", f"u{n}"
        thread = Thread(thread_id, "p", "t", "replay", None, "approval-required", None, None, None, "running", 0.0)
        session = ProviderSession(f"s{n % 50}", thread_id, "replay", "running", 1.0, pid=100 + n % 50)
        out.append(Committed({}, (event("thread.updated", thread, thread_id), event("turn.updated", Turn(turn_id, thread_id, n + 1, "starting", 1.0), thread_id))))
        out.append(Committed({}, (event("session.updated", session, thread_id), event("turn.updated", Turn(turn_id, thread_id, n + 1, "running", 1.0, started_at=2.0), thread_id))))
        for first in range(0, ITEMS_PER_TURN, BATCH):
            items = tuple(
                event("item.updated", TurnItem(f"{turn_id}:{i}", thread_id, turn_id, i, "assistant_message", "streaming", None, "x", None, 2.0), thread_id)
                for i in range(first, first + BATCH)
            )
            out.append(Committed({}, items))
        done = Turn(turn_id, thread_id, n + 1, "completed", 1.0, started_at=2.0, completed_at=5.0)
        out.append(Committed({}, (event("turn.updated", done, thread_id), event("thread.updated", thread, thread_id))))
    return out


def measure(turns: int) -> tuple[float, int]:
    """Seconds for one pass of every batch through a fresh tally, and the events in them."""
    work = batches(turns)
    tally = CommitTally()
    started = time.perf_counter()
    for committed in work:
        tally.on_commit(committed)
    return time.perf_counter() - started, sum(len(c.events) for c in work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000, help="turns per run (default 2000, ~94,000 events)")
    args = parser.parse_args(argv)
    for name in ("t3d.turns", "t3d.agents"):  # formatted, then dropped, as a quiet log handler would
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        handler = logging.StreamHandler(open("/dev/null", "w"))  # noqa: SIM115 -- lives as long as the process
        logger.addHandler(handler)
    runs = [measure(args.turns) for _ in range(5)]
    events = runs[0][1]
    per_event = [seconds / events * 1e6 for seconds, _ in runs]
    print(f"CommitTally.on_commit: {events} events per run, {sum(per_event) / len(per_event):.3f} µs per event (mean of 5 runs), best {min(per_event):.3f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
