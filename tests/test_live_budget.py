"""The connection budget (t3d/live/budget.py) with the real hub subscriptions. Pure.

What it pins: whatever the order of pushes, deliveries, held replies and unsubscribes, the
budget's count equals what the subscriptions buffer; a push never leaves the connection over
its budget unless held replies alone fill it; room is made by resyncing the fullest
subscription first; a resynced subscription holds nothing until its fresh base.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from t3d.live.budget import Budget
from t3d.live.hub import Subscription

LIMIT = 10_000


def member(budget: Budget, name: str) -> Subscription:
    sub = Subscription(name, "thread", "t", lambda: None, budget=budget, live=True)
    budget.members.add(sub)
    return sub


def test_room_is_made_by_resyncing_the_fullest_subscription_first() -> None:
    budget = Budget(LIMIT)
    small, large, other = member(budget, "small"), member(budget, "large"), member(budget, "other")
    for n in range(3):
        small.push((n, b"s" * 1000))
    for n in range(6):
        large.push((n, b"l" * 1000))
    assert budget.used == 9000 and budget.relieved == 0
    other.push((10, b"o" * 2000))  # 11,000 > 10,000: the 6,000 of "large" go
    assert large.needs_resync and large.buffered_bytes == 0 and large.resyncs == 1
    assert not small.needs_resync and small.buffered_bytes == 3000
    assert other.buffered_bytes == 2000 and budget.used == 5000 and budget.relieved == 1
    large.push((11, b"l" * 10))  # ignored until its fresh base: the snapshot covers it
    assert large.buffered_bytes == 0


def test_held_replies_count_and_push_buffers_out_of_the_way() -> None:
    budget = Budget(LIMIT)
    a, b = member(budget, "a"), member(budget, "b")
    a.push((1, b"a" * 4000))
    b.push((1, b"b" * 3000))
    budget.hold(5000)  # a snapshot reply: a (the fullest) is resynced to make room
    assert a.needs_resync and not b.needs_resync and budget.used == 8000
    budget.hold(20_000)  # larger than the budget: held anyway, every buffer dropped
    assert b.needs_resync and budget.buffered == 0 and budget.held == 25_000
    budget.release(25_000)
    assert budget.used == 0 and budget.high_water == 25_000


Step = tuple[str, int, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["push", "pop", "hold", "release", "resync", "leave"]),
        st.integers(0, 3),
        st.integers(1, 4000),
    ),
    max_size=120,
)


@given(steps)
def test_the_budget_counts_exactly_what_its_subscriptions_buffer(program: list[Step]) -> None:
    budget = Budget(LIMIT)
    subs = [member(budget, f"s{n}") for n in range(4)]
    held: list[int] = []
    for seq, (op, index, size) in enumerate(program):
        sub = subs[index]
        if op == "push":
            before_held = budget.held
            sub.push((seq, b"x" * size))
            assert budget.used <= LIMIT or before_held + size > LIMIT
        elif op == "pop":
            sub.pop()
        elif op == "hold":
            budget.hold(size)
            held.append(size)
        elif op == "release" and held:
            budget.release(held.pop())
        elif op == "resync" and sub.needs_resync:
            sub.begin_resync()
            sub.went_live(seq)
        elif op == "leave":
            sub.take()
            budget.members.discard(sub)
            subs[index] = member(budget, f"s{index}-{seq}")
        assert budget.buffered == sum(s.buffered_bytes for s in budget.members)
        assert budget.held == sum(held)
        assert all(s.buffered_bytes == 0 for s in budget.members if s.needs_resync)
        assert budget.high_water >= budget.used
