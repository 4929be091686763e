"""A stateful model of live delivery: publish, subscribe, slow reads, overflow, reconnect.

The machine drives the real pure parts (Hub, Subscription, the wire projection,
snapshot chunks, resume bases and the replay window) the way a connection does
(t3d/api/feeds.py): join the hub, read a base later (commits may land in
between), apply it, go live, pop frames when the client reads, resync on
overflow, reconnect with ``after_sequence``. Buffers and replay bounds are tiny
so overflows and snapshot fallbacks happen often. The event log and its
projection stand in for the database.

What it proves: whatever the interleaving, each client, once drained, holds
exactly the projection of its thread (in wire form, large fields summarized);
no client ever applies a live or replayed event at or below what it already
holds (nothing twice); no buffer passes its bounds.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from live_support import merge_chunks

from t3d.domain.codec import to_json
from t3d.domain.model import Entity, RuntimeRequest, Thread, Turn, TurnItem
from t3d.live.base import Replay, Snapshot, decode_thread_resume, decode_thread_snapshot
from t3d.live.hub import Hub, Subscription
from t3d.live.wire import summarize_payload
from t3d.store.commit import Committed, StoredEvent
from t3d.store.queries import SnapshotRaw
from t3d.store.replay import ThreadReplayRaw, replay_window

THREADS = ("t1", "t2")
MAX_ITEMS, MAX_BYTES = 6, 24_000
REPLAY_EVENTS, REPLAY_BYTES = 5, 30_000
TEXT_SIZES = (0, 10, 300, 20_000, 50_000)  # the last two are summarized in a command item


@attrs.define
class Client:
    thread_id: str
    sub: Subscription
    phase: str = "joined"  # joined (base to read) -> read (base to apply) -> live
    after: int | None = None
    base: Snapshot | Replay | None = None
    view: dict[str, Any] = attrs.Factory(dict)  # (kind, id) -> wire entity
    position: int = 0  # the last sequence this client holds


def _key(kind: str, entity: dict[str, Any]) -> str:
    return f"{kind.split('.')[0]}:{entity['id']}"


class LiveDelivery(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hub = Hub()
        self.log: list[tuple[int, str, str, bytes]] = []  # (seq, kind, thread id, payload)
        self.state: dict[str, dict[str, Entity]] = {t: {} for t in THREADS}  # thread -> key -> entity
        self.clients: list[Client] = []
        self.seq = 0
        self.subs = 0

    @initialize(encode_once=st.booleans())
    def start(self, encode_once: bool) -> None:
        self.hub.encode_once = encode_once
        for thread_id in THREADS:
            self._commit([self._thread(thread_id, "new")])

    # --- the world: commits ----------------------------------------------------------

    def _thread(self, thread_id: str, title: str) -> Thread:
        return Thread(thread_id, "p", title, "replay", None, "approval-required", None, None, None, "idle", 0.0)

    def _commit(self, entities: list[Entity]) -> None:
        events = []
        for entity in entities:
            self.seq += 1
            kind = {Thread: "thread", Turn: "turn", TurnItem: "item", RuntimeRequest: "request"}[type(entity)] + ".updated"
            thread_id = entity.id if isinstance(entity, Thread) else entity.thread_id  # type: ignore[union-attr]
            payload = orjson.dumps(to_json(entity))
            events.append(StoredEvent(self.seq, kind, thread_id, entity, payload, 0.0))
            self.log.append((self.seq, kind, thread_id, payload))
            self.state[thread_id][_key(kind, {"id": entity.id})] = entity
        self.hub.publish(Committed({}, tuple(events)))

    @rule(data=st.data(), count=st.integers(1, 4))
    def publish(self, data: st.DataObject, count: int) -> None:
        """One commit of a few changes (possibly on both threads)."""
        batch: list[Entity] = []
        for _ in range(count):
            thread_id = data.draw(st.sampled_from(THREADS))
            state = self.state[thread_id]
            turns = [e for e in state.values() if isinstance(e, Turn)]
            what = data.draw(st.sampled_from(["rename", "turn", "item", "request"]))
            if what == "rename" or (not turns and what != "turn"):
                batch.append(self._thread(thread_id, data.draw(st.text(max_size=5))))
            elif what == "turn":
                if turns and data.draw(st.booleans()):
                    turn = data.draw(st.sampled_from(turns))
                    batch.append(attrs.evolve(turn, status=data.draw(st.sampled_from(["running", "completed"]))))
                else:
                    batch.append(Turn(f"{thread_id}-u{len(turns) + 1}", thread_id, len(turns) + 1, "running", 0.0))
            elif what == "item":
                turn = data.draw(st.sampled_from(turns))
                ordinal = data.draw(st.integers(1, 3))
                text = "x" * data.draw(st.sampled_from(TEXT_SIZES))
                kind = data.draw(st.sampled_from(["assistant_message", "command"]))
                item_id = f"{turn.id}-i{ordinal}"
                batch.append(TurnItem(item_id, thread_id, turn.id, ordinal, kind, "streaming", None, text, None, 0.0))
            else:
                turn = data.draw(st.sampled_from(turns))
                status = data.draw(st.sampled_from(["pending", "resolved"]))
                batch.append(RuntimeRequest(f"{turn.id}-r", thread_id, turn.id, "i", "permission", status, 0.0))
        self._commit(batch)

    # --- clients -----------------------------------------------------------------------

    def _join(self, thread_id: str) -> Subscription:
        self.subs += 1
        sub = Subscription(f"s{self.subs}", "thread", thread_id, lambda: None, max_items=MAX_ITEMS, max_bytes=MAX_BYTES)
        self.hub.subscribe(sub)
        return sub

    @precondition(lambda self: len(self.clients) < 4)
    @rule(thread_id=st.sampled_from(THREADS))
    def subscribe(self, thread_id: str) -> None:
        self.clients.append(Client(thread_id, self._join(thread_id)))

    def _snapshot(self, thread_id: str) -> Snapshot:
        """What snapshot_query + decode give for the projection (every turn, pending requests)."""
        state = self.state[thread_id]
        turns = sorted((e for e in state.values() if isinstance(e, Turn)), key=lambda t: t.ordinal)
        items: list[bytes] = []
        counts = []
        for turn in turns:
            mine = sorted((e for e in state.values() if isinstance(e, TurnItem) and e.turn_id == turn.id), key=lambda i: i.ordinal)
            items += [orjson.dumps(to_json(i)) for i in mine]
            counts.append(len(mine))
        requests = [orjson.dumps(to_json(e)) for e in state.values() if isinstance(e, RuntimeRequest) and e.status == "pending"]
        thread = orjson.dumps(to_json(state[f"thread:{thread_id}"]))
        raw = SnapshotRaw(self.seq, thread, [orjson.dumps(to_json(t)) for t in turns], items, requests, False, tuple(counts))
        snapshot = decode_thread_snapshot(raw)
        assert snapshot is not None
        return snapshot

    def _read(self, client: Client) -> None:
        if client.after is None:
            client.base = self._snapshot(client.thread_id)
            return
        rows = ((s, k, p) for s, k, t, p in self.log if t == client.thread_id and s > client.after)
        events = replay_window(rows, REPLAY_EVENTS, REPLAY_BYTES) if client.after <= self.seq else None
        if events is None:
            client.base = self._snapshot(client.thread_id)
        else:
            client.base = decode_thread_resume(ThreadReplayRaw(self.seq, events))

    def _apply_event(self, client: Client, seq: int, frame: bytes) -> None:
        assert seq > client.position, f"event {seq} delivered twice (client holds up to {client.position})"
        event = orjson.loads(frame)
        assert event["sequence"] == seq
        client.view[_key(event["kind"], event["entity"])] = event["entity"]
        client.position = seq

    def _apply_base(self, client: Client) -> None:
        base = client.base
        assert base is not None
        if isinstance(base, Snapshot):
            notes = [{"kind": "snapshot.chunk", "data": orjson.loads(chunk)} for chunk in base.chunks]
            snap = merge_chunks(notes)
            client.view = {f"thread:{snap['thread']['id']}": snap["thread"]}
            for name, kind in (("turns", "turn"), ("items", "item"), ("requests", "request")):
                for entity in snap[name]:
                    client.view[f"{kind}:{entity['id']}"] = entity
            client.position = base.sequence
        else:
            for seq, frame in base.frames:
                self._apply_event(client, seq, frame)
            client.position = max(client.position, base.sequence)
        client.base, client.phase = None, "live"
        client.sub.went_live(base.sequence)

    def _step(self, client: Client, frames: int) -> bool:
        """Advance one client as its connection would; False when it had nothing to do."""
        if client.phase == "joined":
            self._read(client)
            client.phase = "read"
        elif client.phase == "read":
            self._apply_base(client)
        elif client.sub.needs_resync:
            client.sub.begin_resync()
            client.phase, client.after = "joined", None  # resync: a fresh snapshot follows
        else:
            moved = False
            for _ in range(frames):
                frame = client.sub.pop()
                if frame is None:
                    break
                self._apply_event(client, *frame)
                moved = True
            return moved
        return True

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), frames=st.integers(0, 3))
    def read_slowly(self, data: st.DataObject, frames: int) -> None:
        """One client takes one step: reads its base, applies it, or takes a few frames."""
        self._step(data.draw(st.sampled_from(self.clients)), frames)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), resume=st.booleans())
    def reconnect(self, data: st.DataObject, resume: bool) -> None:
        """The connection drops (buffer and all) and comes back, resuming where it was."""
        client = data.draw(st.sampled_from(self.clients))
        self.hub.unsubscribe(client.sub)
        assert not client.sub.frames and client.sub.buffered_bytes == 0
        client.sub = self._join(client.thread_id)
        client.phase, client.base = "joined", None
        client.after = client.position if resume and client.view else None

    @invariant()
    def buffers_stay_bounded(self) -> None:
        for client in self.clients:
            assert len(client.sub.frames) <= MAX_ITEMS and client.sub.buffered_bytes <= MAX_BYTES

    def teardown(self) -> None:
        while any(self._step(client, 1000) for client in self.clients):
            pass
        for client in self.clients:
            assert _open(client.view) == self._projection(client.thread_id), client.thread_id

    def _projection(self, thread_id: str) -> dict[str, Any]:
        """The thread as a client should hold it: every entity in wire form."""
        out = {}
        for key, entity in self.state[thread_id].items():
            out[key] = orjson.loads(summarize_payload(orjson.dumps(to_json(entity))))
        return _open(out)


def _open(view: dict[str, Any]) -> dict[str, Any]:
    """Without settled requests: a snapshot holds pending ones only, events hold every state."""
    return {k: v for k, v in view.items() if not k.startswith("request:") or v["status"] == "pending"}


class TestLiveDelivery(LiveDelivery.TestCase):  # type: ignore[name-defined]
    settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
