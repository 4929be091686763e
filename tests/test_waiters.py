"""The long-poll registry (t3d/live/waiters.py), pure: committed events in, waiters woken.

Events are built as the store publishes them (`Committed` of `StoredEvent`s with the
entity's encoded payload), so each test pins what `on_commit` makes of a real commit.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from t3d.domain.codec import to_json
from t3d.domain.model import RuntimeRequest, Thread
from t3d.live.waiters import RequestWaiters, Waiter, WaitersFull
from t3d.live.wire import FIELD_LIMIT
from t3d.store.commit import Committed, StoredEvent


def request(request_id: str, thread_id: str = "t1", status: Any = "pending", data: Any = None) -> RuntimeRequest:
    return RuntimeRequest(request_id, thread_id, "turn", f"{request_id}-item", "permission", status, 0.0, data=data)


def event(sequence: int, entity: Any, kind: str = "request.updated") -> StoredEvent:
    thread_id = entity.id if isinstance(entity, Thread) else entity.thread_id
    return StoredEvent(sequence, kind, thread_id, entity, orjson.dumps(to_json(entity)), 0.0)


def commit(*events: StoredEvent) -> Committed:
    return Committed({}, events)


def seeded(**bounds: int) -> RequestWaiters:
    waiters = RequestWaiters(**bounds)
    waiters.begin_seed()
    waiters.seed([], 0)
    return waiters


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_request_opened_after_the_cursor_wakes_its_waiter_and_only_it() -> None:
    """A pending request.updated hands the request (its wire JSON) to every waiter whose cursor
    it passes and whose thread it is; a waiter of another thread, or one whose cursor is at or
    past the opening sequence, is neither handed it nor woken."""
    waiters = seeded()
    mine, any_thread, other, behind = Wakes(), Wakes(), Wakes(), Wakes()
    waiters.add(Waiter(5, frozenset({"t1"}), 10, wake=mine))
    waiters.add(Waiter(5, None, 10, wake=any_thread))
    waiters.add(Waiter(5, frozenset({"t2"}), 10, wake=other))
    late = Waiter(7, None, 10, wake=behind)
    waiters.add(late)
    waiters.on_commit(commit(event(7, request("r1"))))
    assert (mine.count, any_thread.count, other.count, behind.count) == (1, 1, 0, 0)
    assert late.found == []
    assert [r.request_id for r in waiters.pending_after(5, None, 10)] == ["r1"]
    assert waiters.pending_after(7, None, 10) == [] and waiters.last_sequence == 7


def test_the_index_lists_the_oldest_newer_requests_first_up_to_the_limit_and_forgets_closed_ones() -> None:
    """pending_after gives requests opened after the cursor in opening order, at most
    ``limit``, filtered by thread; a closing event (any other status) or the thread's
    deletion removes requests from the index and from what waiters were handed."""
    waiters = seeded()
    holder = Waiter(0, None, 10)
    waiters.add(holder)
    waiters.on_commit(commit(event(1, request("a")), event(2, request("b", "t2")), event(3, request("c"))))
    assert [r.request_id for r in waiters.pending_after(0, None, 2)] == ["a", "b"]
    assert [r.request_id for r in waiters.pending_after(1, frozenset({"t1"}), 10)] == ["c"]
    waiters.on_commit(commit(event(4, request("a", status="resolved"))))
    assert [f[1] for f in holder.found] == ["b", "c"]
    thread = Thread("t2", "p", "title", "replay", None, "approval-required", None, None, None, "idle", 0.0)
    waiters.on_commit(commit(event(5, thread, "thread.deleted")))
    assert [r.request_id for r in waiters.pending_after(0, None, 10)] == ["c"]
    assert [f[1] for f in holder.found] == ["c"]


def test_a_large_request_is_summarized_once_for_every_waiter() -> None:
    """The wire JSON handed to waiters has large fields summarized, and it is the very same
    bytes object for every waiter (encoded once)."""
    waiters = seeded()
    first, second = Waiter(0, None, 10), Waiter(0, frozenset({"t1"}), 10)
    waiters.add(first)
    waiters.add(second)
    waiters.on_commit(commit(event(1, request("big", data={"input": "x" * (FIELD_LIMIT * 2)}))))
    wire = first.found[0][2]
    assert wire is second.found[0][2]
    assert len(wire) < FIELD_LIMIT and orjson.loads(wire)["truncated"]


def test_a_waiter_keeps_at_most_its_limit() -> None:
    """Past its limit a waiter is handed nothing more (the index keeps them for the next
    long-poll, whose cursor is the last one returned)."""
    waiters = seeded()
    waiter = Waiter(0, None, 2)
    waiters.add(waiter)
    waiters.on_commit(commit(*(event(n, request(f"r{n}")) for n in range(1, 5))))
    assert [f[1] for f in waiter.found] == ["r1", "r2"]
    assert [r.request_id for r in waiters.pending_after(2, None, 10)] == ["r3", "r4"]


def test_seeding_merges_with_commits_made_while_the_read_ran() -> None:
    """The seed read's rows join the index in opening order, except requests closed (or whose
    thread was deleted) while the read ran; requests committed meanwhile stay indexed once."""
    waiters = RequestWaiters()
    assert waiters.needs_seed
    waiters.on_commit(commit(event(10, request("new"))))
    waiters.begin_seed()
    waiters.on_commit(commit(event(11, request("old-closed", status="expired"))))
    thread = Thread("gone", "p", "title", "replay", None, "approval-required", None, None, None, "idle", 0.0)
    waiters.on_commit(commit(event(12, thread, "thread.deleted")))
    waiters.seed([("old", "t1", 3), ("old-closed", "t1", 4), ("of-gone", "gone", 5), ("new", "t1", 10)], 9)
    assert not waiters.needs_seed
    assert [(r.request_id, r.sequence) for r in waiters.pending_after(0, None, 10)] == [("old", 3), ("new", 10)]
    assert waiters.last_sequence == 12


def test_bounds_refuse_with_a_message_that_names_the_bound_and_the_fix() -> None:
    """One waiter past the total bound, or past the bound of its owner, is refused with
    WaitersFull naming the number and what to do; removing one makes room again, and a
    removed waiter is forgotten (removing it twice changes nothing)."""
    waiters = seeded(max_waiters=3, max_per_owner=2)
    connection = object()
    first, second = Waiter(0, None, 1, connection), Waiter(0, None, 1, connection)
    waiters.add(first)
    waiters.add(second)
    with pytest.raises(WaitersFull, match=r"this connection already holds 2 .*several threads \(thread_ids\) or every thread"):
        waiters.add(Waiter(0, None, 1, connection))
    waiters.add(Waiter(0, frozenset({"t1"}), 1))
    with pytest.raises(WaitersFull, match=r"already holds 3 requests.wait long-polls, its bound; retry"):
        waiters.add(Waiter(0, None, 1))
    waiters.remove(first)
    waiters.remove(first)
    waiters.add(Waiter(0, None, 1, connection))
    assert waiters.statistics().waiters == 3


def test_past_its_bound_the_index_overflows_and_a_reseed_that_fits_clears_it() -> None:
    """At max_pending the next opening is not indexed (waiters still get it), long-polls are
    refused naming the bound, and the index asks to be read again; a seed that fits clears
    the overflow."""
    waiters = seeded(max_pending=2)
    watching = Waiter(0, None, 10)
    waiters.add(watching)
    waiters.on_commit(commit(*(event(n, request(f"r{n}")) for n in range(1, 4))))
    assert [f[1] for f in watching.found] == ["r1", "r2", "r3"]
    assert waiters.overflowed and waiters.needs_seed
    with pytest.raises(WaitersFull, match="more than 2 runtime requests are pending"):
        waiters.add(Waiter(0, None, 10))
    waiters.on_commit(commit(event(4, request("r1", status="resolved")), event(5, request("r2", status="resolved"))))
    waiters.begin_seed()
    waiters.seed([("r3", "t1", 3)], 5)
    assert not waiters.overflowed
    assert [r.request_id for r in waiters.pending_after(0, None, 10)] == ["r3"]


@attrs.define
class Model:
    pending: dict[str, tuple[str, int]] = attrs.Factory(dict)


@given(st.lists(st.tuples(st.sampled_from(["open", "close"]), st.integers(0, 5), st.sampled_from(["t1", "t2"])), max_size=40), st.integers(0, 40), st.sampled_from([None, frozenset({"t1"}), frozenset({"t2"}), frozenset({"t1", "t2"})]))
def test_the_index_always_holds_exactly_the_pending_requests_newer_than_any_cursor(steps: list[tuple[str, int, str]], after: int, threads: frozenset[str] | None) -> None:
    """Whatever opens and closes, in any order, the index lists exactly the requests a model
    says are pending and were opened after the cursor, in opening order."""
    waiters, model = seeded(), Model()
    for sequence, (action, n, thread) in enumerate(steps, 1):
        request_id = f"r{n}"
        if action == "open" and request_id not in model.pending:
            model.pending[request_id] = (thread, sequence)
            waiters.on_commit(commit(event(sequence, request(request_id, thread))))
        elif action == "close" and request_id in model.pending:
            waiters.on_commit(commit(event(sequence, request(request_id, model.pending.pop(request_id)[0], "cancelled"))))
    expected = sorted((s, r) for r, (t, s) in model.pending.items() if s > after and (threads is None or t in threads))
    assert [(r.sequence, r.request_id) for r in waiters.pending_after(after, threads, 100)] == expected


def test_a_commit_wakes_the_requests_own_thread_waiters_before_those_of_every_thread() -> None:
    """The waiters of the request's thread are woken (and handed it) before the waiters of
    every thread, whatever order they were added in: the thread's own bot answers."""
    waiters = seeded()
    order: list[str] = []
    t1 = frozenset({"t1"})
    for name, threads in (("any-1", None), ("mine-1", t1), ("any-2", None), ("mine-2", t1)):
        waiters.add(Waiter(0, threads, 10, wake=partial(order.append, name)))
    waiters.on_commit(commit(event(3, request("r1"))))
    assert sorted(order[:2]) == ["mine-1", "mine-2"] and sorted(order[2:]) == ["any-1", "any-2"]


def test_each_opened_request_is_timed_from_created_at_to_commit_and_from_commit_to_each_reply() -> None:
    """`on_committed` gets, per request opened, the seconds since its created_at; `replied`
    times, per request a reply carries, the seconds since its commit reached `on_commit`,
    labelled with the reply's transport. A request the seed read found (its commit time is
    not known) and one no longer pending are not timed."""
    waiters = RequestWaiters()
    waiters.begin_seed()
    waiters.seed([("old", "t1", 1)], 1)
    committed: list[float] = []
    replies: list[tuple[str, float]] = []
    waiters.on_committed = committed.append
    waiters.on_replied = lambda via, seconds: replies.append((via, seconds))
    opened = attrs.evolve(request("r1"), created_at=time.time() - 0.25)
    waiter = Waiter(1, None, 10)
    waiters.add(waiter)
    waiters.on_commit(commit(event(4, opened), event(5, request("r2"))))
    assert len(committed) == 2 and 0.25 <= committed[0] < 30 and committed[1] > 1e6  # r2: created_at 0.0
    waiters.replied(waiter.found, "mcp")
    assert [via for via, _ in replies] == ["mcp", "mcp"] and all(0 <= s < 30 for _, s in replies)
    replies.clear()
    waiters.on_commit(commit(event(6, request("r2", status="allowed"))))
    waiters.replied([(1, "old", b"{}"), (5, "r2", b"{}"), (4, "r1", b"{}")], "rpc")
    assert [via for via, _ in replies] == ["rpc"]


def test_the_newest_requests_wire_json_is_kept_up_to_its_bound_and_dropped_when_they_close() -> None:
    """A request opened by a commit keeps its wire JSON (what a waiter is handed), so a later
    long-poll need not read it; past ``max_wires`` the oldest is dropped (the index still
    holds the request); closing or forgetting a request drops it; a request the seed read
    found has none."""
    waiters = RequestWaiters(max_wires=2)
    waiters.begin_seed()
    waiters.seed([("old", "t1", 1)], 1)
    waiter = Waiter(1, None, 10)
    waiters.add(waiter)
    waiters.on_commit(commit(event(2, request("r1")), event(3, request("r2")), event(4, request("r3"))))
    assert waiters.wire_of("old") is None and waiters.wire_of("r1") is None
    assert waiters.wire_of("r3") is waiter.found[2][2] and waiters.wire_of("r2") is not None
    assert [r.request_id for r in waiters.pending_after(0, None, 10)] == ["old", "r1", "r2", "r3"]
    waiters.on_commit(commit(event(5, request("r2", status="allowed"))))
    waiters.forget(["r3"])
    assert waiters.wire_of("r2") is None and waiters.wire_of("r3") is None


def test_a_waiter_of_several_threads_is_woken_by_each_of_them_once_and_leaves_no_trace() -> None:
    """A waiter of threads {t1, t2} is handed a request of either (once each) and none of t3;
    the index filters by the same set; removing it forgets it under every thread it watched,
    and a waiter of no thread at all is refused."""
    waiters = seeded()
    wakes = Wakes()
    both = Waiter(0, frozenset({"t1", "t2"}), 10, wake=wakes)
    waiters.add(both)
    waiters.on_commit(commit(event(1, request("a")), event(2, request("b", "t2")), event(3, request("c", "t3"))))
    assert [f[1] for f in both.found] == ["a", "b"] and wakes.count == 2
    assert [r.request_id for r in waiters.pending_after(0, frozenset({"t2", "t3"}), 10)] == ["b", "c"]
    waiters.remove(both)
    assert waiters.statistics().waiters == 0 and waiters._waiters == {}
    waiters.remove(both)  # idempotent
    with pytest.raises(ValueError, match="at least one thread"):
        waiters.add(Waiter(0, frozenset(), 10))
    assert waiters.statistics().waiters == 0


def test_pending_wires_lists_the_pending_requests_from_memory_or_says_a_read_must() -> None:
    """`pending_wires` (requests.pending without a read): the kept wire JSON of every pending
    request, oldest first, of one thread or of all; closed ones are gone. None (read the
    database) before the seed, while a request the seed found has no kept wire, while
    overflowed, and past ``max_wires`` pending."""
    waiters = RequestWaiters(max_wires=3, max_pending=4)
    waiters.on_commit(commit(event(1, request("r1"))))
    assert waiters.pending_wires(None) is None  # not seeded yet
    waiters.begin_seed()
    waiters.seed([("old", "t1", 1)], 1)
    assert waiters.pending_wires(None) is None  # "old" was found by the read: no wire kept
    waiters.on_commit(commit(event(2, request("old", status="allowed")), event(3, request("r2", "t2"))))
    wires = waiters.pending_wires(None)
    assert wires is not None and [orjson.loads(w)["id"] for w in wires] == ["r1", "r2"]
    assert wires[1] == waiters.wire_of("r2")
    t2 = waiters.pending_wires("t2")
    assert t2 is not None and [orjson.loads(w)["id"] for w in t2] == ["r2"]
    assert waiters.pending_wires("t3") == []
    waiters.on_commit(commit(event(4, request("r3")), event(5, request("r4"))))
    assert waiters.pending_wires(None) is None  # 4 pending, 3 wires kept at most
    waiters.on_commit(commit(event(6, request("r1", status="denied"))))
    wires = waiters.pending_wires(None)
    assert wires is not None and [orjson.loads(w)["id"] for w in wires] == ["r2", "r3", "r4"]
    waiters.on_commit(commit(event(7, request("r5")), event(8, request("r6"))))
    assert waiters.overflowed and waiters.pending_wires(None) is None
