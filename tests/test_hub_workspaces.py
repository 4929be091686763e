"""The live hub and workspace statuses: rows carry them, only subscriptions that asked get
them (and are the leases), and a subscription keeps only the latest value per workspace."""

from __future__ import annotations

from collections.abc import Mapping

from t3d.live.hub import Hub, Subscription
from t3d.store.commit import Committed, ShellRow


class View:
    """A fixed set of workspace values: thread id -> (path, value)."""

    def __init__(self, values: dict[str, tuple[str, bytes]]) -> None:
        self.values = values
        self.changes = 0

    def row(self, thread_id: str) -> bytes | None:
        found = self.values.get(thread_id)
        return found[1] if found else None

    def rows(self) -> Mapping[str, bytes]:
        return {t: v for t, (_, v) in self.values.items()}

    def of_thread(self, thread_id: str) -> tuple[str, bytes] | None:
        return self.values.get(thread_id)

    def every(self) -> Mapping[str, bytes]:
        return dict(self.values.values())

    def watchers_changed(self) -> None:
        self.changes += 1


def _sub(topic: str, thread_id: str | None, *, watch: bool) -> tuple[Subscription, list[int]]:
    wakes: list[int] = []
    return Subscription("s", topic, thread_id, lambda: wakes.append(1), watch_workspace=watch), wakes  # type: ignore[arg-type]


def test_shell_rows_carry_their_thread_s_workspace() -> None:
    """A shell row goes out with its thread's current workspace value spliced in last; a row
    of a thread without one, and a removed row, are left as they are."""
    hub = Hub()
    hub.workspaces = View({"t1": ("/p", b'{"path":"/p","state":"ok"}')})
    shell, _ = _sub("shell", None, watch=False)
    hub.subscribe(shell)
    hub.publish(Committed({}, (), (ShellRow("t1", 1, b'{"id":"t1"}'), ShellRow("t2", 2, b'{"id":"t2"}'), ShellRow("t3", 3, None))))
    frames = [data for _, data in shell.take()]
    assert frames[0].endswith(b'"entity":{"id":"t1","workspace":{"path":"/p","state":"ok"}}}')
    assert frames[1].endswith(b'"entity":{"id":"t2"}}')
    assert b"shell.removed" in frames[2]


def test_only_subscriptions_that_asked_get_values_and_count_as_watchers() -> None:
    """`watchers` names the shell and the threads whose subscriptions asked; a thread
    subscription that asked gets its thread's value on joining; posts reach those that asked
    and follow the threads named; joining and leaving tell the view."""
    view = View({"t1": ("/p", b"v1")})
    hub = Hub()
    hub.workspaces = view
    plain_shell, _ = _sub("shell", None, watch=False)
    plain_thread, _ = _sub("thread", "t1", watch=False)
    hub.subscribe(plain_shell)
    hub.subscribe(plain_thread)
    assert hub.watchers() == (False, frozenset()) and view.changes == 0
    watcher, wakes = _sub("thread", "t1", watch=True)
    other, _ = _sub("thread", "t2", watch=True)
    shell, _ = _sub("shell", None, watch=True)
    for sub in (watcher, other, shell):
        hub.subscribe(sub)
    assert hub.watchers() == (True, frozenset({"t1", "t2"})) and view.changes == 3
    assert watcher.workspace == {"/p": b"v1"} and shell.workspace == {}

    hub.publish_workspace("/p", ["t1"], b"v2")
    assert watcher.workspace == {"/p": b"v2"} and shell.workspace == {"/p": b"v2"} and wakes
    assert other.workspace == {} and plain_thread.workspace == {} and plain_shell.workspace == {}
    hub.unsubscribe(watcher)
    assert watcher.workspace == {} and hub.watchers() == (True, frozenset({"t2"})) and view.changes == 4


def test_a_slow_subscription_keeps_only_the_latest_value_per_workspace() -> None:
    """Values posted faster than they are sent replace each other: one per workspace waits,
    however many changes came."""
    hub = Hub()
    hub.workspaces = View({})
    shell, _ = _sub("shell", None, watch=True)
    hub.subscribe(shell)
    for n in range(1000):
        hub.publish_workspace(f"/w{n % 3}", [], b"%d" % n)
    assert shell.workspace == {"/w0": b"999", "/w1": b"997", "/w2": b"998"}


def test_a_resuming_shell_subscription_is_handed_every_value() -> None:
    """A shell subscription that resumes (its replay carries only the rows that moved) joins
    with every workspace's current value waiting."""
    hub = Hub()
    hub.workspaces = View({"t1": ("/a", b"a"), "t2": ("/b", b"b")})
    shell, _ = _sub("shell", None, watch=True)
    hub.subscribe(shell, every_workspace=True)
    assert shell.workspace == {"/a": b"a", "/b": b"b"}
