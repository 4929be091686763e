"""The live hub: encode once, bounded buffers, resync instead of growth."""

from __future__ import annotations

from t3d.domain.model import Project, Thread
from t3d.live.hub import Hub, Subscription
from t3d.store.commit import Committed, ShellRow, StoredEvent


def _thread_event(seq: int, thread_id: str = "t1", title: str = "x") -> StoredEvent:
    thread = Thread(
        id=thread_id, project_id="p", title=title, provider="replay", model=None, runtime_mode="approval-required",
        worktree_path=None, branch=None, parent_thread_id=None, status="idle", created_at=0.0,
    )
    return StoredEvent(seq, "thread.updated", thread_id, thread, b'{"id":"%s"}' % thread_id.encode(), 0.0)


def _sub(topic: str = "thread", thread_id: str | None = "t1", **kw: int) -> tuple[Subscription, list[int]]:
    wakes: list[int] = []
    return Subscription("s1", topic, thread_id, lambda: wakes.append(1), **kw), wakes  # type: ignore[arg-type]


def test_each_event_is_encoded_once_for_all_subscribers() -> None:
    """Every subscriber of a thread receives the very same bytes object."""
    hub = Hub()
    a, _ = _sub()
    b, _ = _sub()
    hub.subscribe(a)
    hub.subscribe(b)
    hub.publish(Committed({}, (_thread_event(7),)))
    (seq_a, data_a), (seq_b, data_b) = a.take()[0], b.take()[0]
    assert seq_a == seq_b == 7
    assert data_a is data_b
    assert data_a == b'{"kind":"thread.updated","sequence":7,"entity":{"id":"t1"}}'


def test_events_reach_only_their_thread_and_the_shell_gets_shell_rows() -> None:
    """Thread subscribers see their thread's events; shell subscribers see projects and shell rows."""
    hub = Hub()
    mine, _ = _sub(thread_id="t1")
    other, _ = _sub(thread_id="t2")
    shell, _ = _sub(topic="shell", thread_id=None)
    for s in (mine, other, shell):
        hub.subscribe(s)
    project = Project(id="p", path="/p", title="p", created_at=0.0)
    hub.publish(
        Committed(
            {},
            (_thread_event(1), StoredEvent(2, "project.updated", None, project, b'{"id":"p"}', 0.0)),
            (ShellRow("t1", 1, b'{"id":"t1","turn_count":0}'), ShellRow("t9", 2, None)),
        )
    )
    assert [s for s, _ in mine.take()] == [1]
    assert other.take() == []
    frames = shell.take()
    assert [seq for seq, _ in frames] == [1, 2, 2]
    kinds = [d.split(b'"')[3] for _, d in frames]
    assert kinds == [b"shell.updated", b"project.updated", b"shell.removed"]


def test_a_full_buffer_is_dropped_and_marked_for_resync() -> None:
    """Past its item bound a subscription keeps nothing, asks for resync, and ignores events until then."""
    hub = Hub()
    sub, wakes = _sub(max_items=3)
    hub.subscribe(sub)
    hub.publish(Committed({}, tuple(_thread_event(i) for i in range(1, 5))))
    assert sub.needs_resync and sub.frames == type(sub.frames)() and sub.buffered_bytes == 0
    hub.publish(Committed({}, (_thread_event(9),)))
    assert not sub.frames, "events after the overflow are covered by the coming snapshot"
    assert wakes, "the connection is woken to send the resync"
    assert hub.statistics().resyncs == 1


def test_the_byte_bound_holds_too() -> None:
    """A subscription never buffers more than its byte bound."""
    hub = Hub()
    sub, _ = _sub(max_bytes=200)
    hub.subscribe(sub)
    hub.publish(Committed({}, (_thread_event(1, title="a"), _thread_event(2), _thread_event(3), _thread_event(4))))
    assert sub.needs_resync
    assert sub.buffered_bytes <= 200


def test_unsubscribe_forgets_the_subscription() -> None:
    """No subscription, and no empty topic entry, is kept after unsubscribe."""
    hub = Hub()
    sub, _ = _sub()
    hub.subscribe(sub)
    hub.unsubscribe(sub)
    hub.publish(Committed({}, (_thread_event(1),)))
    assert sub.take() == []
    assert hub.statistics().thread_subscriptions == 0
