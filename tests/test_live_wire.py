"""The pure parts of live delivery: summarized wire entities, bounded chunks and pieces."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from t3d.live.base import thread_parts
from t3d.live.chunks import (
    CHUNK_BYTES,
    CHUNK_DATA_BYTES,
    Parts,
    chunk_objects,
    object_bytes,
    object_pieces,
)
from t3d.live.wire import (
    ENTITY_LIMIT,
    FIELD_LIMIT,
    HEAD_BYTES,
    TEXT_LIMIT,
    summarize_payload,
    value_at,
)
from t3d.store.queries import SnapshotRaw

# --- summarized entities -----------------------------------------------------------------


def _item(**fields: Any) -> dict[str, Any]:
    return {"id": "i1", "thread_id": "t", "turn_id": "u", "ordinal": 1, "kind": "command", "status": "completed",
            "title": None, "text": None, "data": None, "updated_at": 0.0, **fields}  # fmt: skip


def test_a_small_entity_goes_out_as_stored() -> None:
    """Up to 16 KiB the stored bytes are the wire bytes: the very same object, never decoded."""
    payload = orjson.dumps(_item(text="x" * (FIELD_LIMIT - 500)))
    assert len(payload) <= FIELD_LIMIT
    assert summarize_payload(payload) is payload


def test_a_large_field_is_cut_to_its_head_and_listed_with_its_size() -> None:
    """A 100 KiB command output becomes its first 4 KiB; ``truncated`` names its path and full
    size, and that path in the stored entity holds the full value (what item.detail returns).
    Fields under the limit, even in a large entity, are untouched."""
    output = "line of output\n" * 7000
    stored = _item(data={"command": "make", "output": output, "exit": 0}, text="é" * 9000)
    wire = orjson.loads(summarize_payload(orjson.dumps(stored)))
    assert wire["data"]["output"] == output.encode()[:HEAD_BYTES].decode()
    assert wire["truncated"] == [
        {"path": ["data", "output"], "bytes": len(output)},
        {"path": ["text"], "bytes": 18000},
    ]
    assert wire["text"] == "é" * (HEAD_BYTES // 2)  # cut at a character boundary
    assert wire["data"]["command"] == "make" and wire["data"]["exit"] == 0
    for cut in wire["truncated"]:
        assert len(orjson.dumps(value_at(stored, cut["path"]))) > FIELD_LIMIT


def test_a_message_is_kept_whole_up_to_128_kib() -> None:
    """An assistant message is read as it streams: 100 KiB of text go out whole; past
    128 KiB the text is cut to its first 128 KiB and listed, like any other large field."""
    message = _item(kind="assistant_message", text="w" * 100_000, data={"note": "n" * 20_000})
    wire = orjson.loads(summarize_payload(orjson.dumps(message)))
    assert wire["text"] == message["text"]
    assert wire["truncated"] == [{"path": ["data", "note"], "bytes": 20_000}]
    longer = _item(kind="assistant_message", text="w" * 200_000)
    wire = orjson.loads(summarize_payload(orjson.dumps(longer)))
    assert wire["text"] == "w" * TEXT_LIMIT
    assert wire["truncated"] == [{"path": ["text"], "bytes": 200_000}]


def test_many_mid_sized_fields_are_bounded_too() -> None:
    """No string over 16 KiB, but 200 KiB in all: the largest container goes whole (null, with
    its stored size), then top-level strings are cut, until the entity fits ENTITY_LIMIT."""
    stored = _item(data={f"f{n}": "d" * 10_000 for n in range(12)}, text="t" * 15_000, title="h" * 15_000,
                   kind="x" * 15_000, status="s" * 15_000, thread_id="q" * 15_000)  # fmt: skip
    wire_bytes = summarize_payload(orjson.dumps(stored))
    wire = orjson.loads(wire_bytes)
    assert len(wire_bytes) <= ENTITY_LIMIT
    assert wire["data"] is None
    paths = {tuple(c["path"]): c["bytes"] for c in wire["truncated"]}
    assert paths[("data",)] == len(orjson.dumps(stored["data"]))
    assert any(len(p) == 1 and p[0] != "data" for p in paths)


# Shapes, not values: a leaf ("a", n) or ("u", n) is n copies of a 1- or 2-byte character,
# built inside the test (large strings make Hypothesis's reports unreadable).
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=20),
                 st.tuples(st.sampled_from("au"), st.integers(0, 40_000)))  # fmt: skip
keys = st.sampled_from(["a", "b", "c", "d", "data", "text", "é"])
shape = st.recursive(leaf, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6), max_leaves=20)


def build(value: Any) -> Any:
    if isinstance(value, tuple):
        return ("a" if value[0] == "a" else "ü") * value[1]
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, dict):
        return {k: build(v) for k, v in value.items()}
    return value


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(keys, shape, max_size=6))
def test_every_wire_entity_is_bounded_and_says_what_it_cut(fields: dict[str, Any]) -> None:
    """Whatever its shape, a wire entity stays within about ENTITY_LIMIT, each ``truncated``
    entry names a path of the stored entity, and the same payload always gives the same bytes."""
    stored = {"id": "x", **build(fields)}
    payload = orjson.dumps(stored)
    wire_bytes = summarize_payload(payload)
    assert summarize_payload(payload) == wire_bytes
    wire = orjson.loads(wire_bytes)
    assert len(wire_bytes) <= ENTITY_LIMIT + 4 * 1024
    for cut in wire.get("truncated", []):
        full = value_at(stored, cut["path"])
        assert cut["bytes"] == (len(full.encode()) if isinstance(full, str) else len(orjson.dumps(full)))
    if "truncated" not in wire:
        assert wire == stored


# --- chunks --------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 70_000)), max_size=40), st.sampled_from([CHUNK_DATA_BYTES, 100_000]))
def test_chunks_are_bounded_and_merge_back_to_the_snapshot(shapes: list[tuple[int, int]], budget: int) -> None:
    """Every chunk is at most the budget; only the first holds the head; concatenating each
    list over the chunks gives the elements in order; the one-object form says the same."""
    elements = [(i, orjson.dumps({"pad": "p" * n})) for i, n in shapes]
    parts = Parts((("sequence", b"7"), ("thread", b'{"id":"t"}')), ("turns", "items", "requests"), tuple(elements))
    chunks = chunk_objects(parts, budget)
    merged: dict[str, Any] = {"turns": [], "items": [], "requests": []}
    for n, chunk in enumerate(chunks):
        assert len(chunk) <= budget
        data = orjson.loads(chunk)
        assert ("sequence" in data) == (n == 0) and ("thread" in data) == (n == 0)
        for name in ("turns", "items", "requests"):
            merged[name] += data[name]
            assert data[name] or any(data[k] for k in ("turns", "items", "requests")) or n == 0
    for index, name in enumerate(("turns", "items", "requests")):
        assert merged[name] == [orjson.loads(e) for i, e in elements if i == index]
    whole = orjson.loads(object_bytes(parts))
    assert whole == {"sequence": 7, "thread": {"id": "t"}, **merged}
    pieces = object_pieces(parts, 4096)
    assert all(len(p) <= 4096 for p in pieces) and b"".join(pieces) == object_bytes(parts)
    assert all(len(p) <= CHUNK_BYTES for p in object_pieces(parts))


def test_a_thread_snapshot_streams_each_turns_items_before_the_turn() -> None:
    """Turn by turn: a turn's items, then the turn; pending requests last. A client that
    finishes a turn when it sees it terminal has seen its items by then, in any chunking."""
    turns = [orjson.dumps({"id": f"u{n}", "ordinal": n}) for n in (1, 2)]
    items = [orjson.dumps({"id": f"i{n}", "turn_id": t, "pad": "x" * 90_000 if n == 1 else ""})
             for n, t in ((1, "u1"), (2, "u1"), (3, "u2"))]  # fmt: skip
    raw = SnapshotRaw(42, b'{"id":"t"}', turns, items, [b'{"id":"r"}'], True, (2, 1))
    parts = thread_parts(raw)
    assert parts is not None
    order = [orjson.loads(e)["id"] for _, e in parts.elements]
    assert order == ["i1", "i2", "u1", "i3", "u2", "r"]
    head = dict(parts.head)
    assert head["before"] == b"1" and head["has_more"] == b"true"
    assert orjson.loads(parts.elements[0][1])["truncated"][0]["path"] == ["pad"]
