"""Large item fields are stored once and go out summarized the same way everywhere.

A real daemon runs `tests/fixtures/misbehaving_claude` in ``big-line`` mode: each turn is
ONE assistant line carrying MiBs of text (under the 32 MiB line cap). The figures for three
30 MiB lines at once (RSS, bytes stored) come from ``python -m bench.large_lines``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from harness import new_thread, open_client, run_turn, start_daemon
from hypothesis import given
from hypothesis import strategies as st
from served import query
from test_provider_failures import fake_claude

from t3d.store.commit import STORE_ONCE_BYTES
from t3d.store.summary import TEXT_LIMIT, json_copy, summarize_payload, summarize_value

BIG_MIB = 5
SIZE = BIG_MIB * 1024 * 1024


async def test_a_large_provider_line_is_stored_once_and_item_detail_returns_it_whole(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 5 MiB assistant line: the turn completes; live, in a replay and in a snapshot the
    item is the same summary (its text cut to 128 KiB, ``truncated`` giving the full size);
    item.detail returns the whole text; the text is stored once (the item's row), its event
    keeping only the summary, so the database is not twice the text."""
    monkeypatch.setenv("MISBEHAVING_BIG_MIB", str(BIG_MIB))
    binary, _ = fake_claude(tmp_path, "big-line")
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", claude_bin=binary)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, provider="claude")
            outcome = await run_turn(client, thread_id, "big")
            assert outcome.turn["status"] == "completed", outcome.turn
            [live] = [e for e in outcome.events if e["kind"] == "item.updated" and e["entity"]["kind"] == "assistant_message"]
            item = live["entity"]
            assert item["truncated"] == [{"path": ["text"], "bytes": SIZE}]
            assert len(item["text"]) == TEXT_LIMIT and item["text"].startswith("big: 0123456789abcdef")

            value = (await client.call("item.detail", item_id=item["id"], path=["text"]))["value"]
            assert len(value) == SIZE and value.startswith(item["text"])
            snapshot = await client.call("thread.snapshot", thread_id=thread_id)
            assert [i for i in snapshot["items"] if i["id"] == item["id"]] == [item]

        async with open_client(daemon) as again:  # a replay from just before the item
            reply = await again.call("subscribe.thread", thread_id=thread_id, after_sequence=live["sequence"] - 1)
            assert reply["base"] == "replay"
            replayed = await again.wait_event(lambda d: d["entity"].get("id") == item["id"])
            assert replayed == live

        stored = await query(daemon.settings.db_path, "SELECT sum(length(payload)) FROM events WHERE entity_id = ?", item["id"])
        [(body,)] = await query(daemon.settings.db_path, "SELECT length(body) FROM items WHERE id = ?", item["id"])
        [(pages,)] = await query(daemon.settings.db_path, "PRAGMA page_count")
        [(page_size,)] = await query(daemon.settings.db_path, "PRAGMA page_size")
        assert stored[0][0] < STORE_ONCE_BYTES / 4, stored
        assert body > SIZE
        assert pages * page_size < 1.5 * SIZE, (pages, page_size)
        daemon.stop()


def _fields(entity: Any) -> Any:
    from t3d.domain.codec import to_json

    return to_json(entity)


# --- the summary an event stores equals the wire's -----------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_long = st.integers(0, 3).map(lambda n: ["", "x" * 5_000, "é" * 20_000, "y" * 200_000][n])


@given(
    kind=st.sampled_from(["assistant_message", "command", "tool_call"]),
    text=_long,
    data=st.dictionaries(st.sampled_from(["input", "output", "result", "more"]), _json | _long, max_size=4),
    extra=st.lists(_long, max_size=3),
)
def test_an_entity_summarized_without_decoding_is_the_wire_summary_of_its_encoding(
    kind: str, text: str, data: dict[str, Any], extra: list[str]
) -> None:
    """`summarize_value` on a copy of the entity's containers gives exactly the bytes
    `summarize_payload` gives for its encoding (so an event stored as a summary replays as
    it went out live and as a snapshot shows it), leaves the entity itself untouched, and a
    summary is its own summary."""
    entity = {"id": "i", "kind": kind, "text": text, "data": {**data, "extra": tuple(extra)}, "n": 1.5}
    before = orjson.dumps(entity)
    payload = orjson.dumps(entity)
    summary = summarize_value(json_copy(entity), len(payload))
    assert (summary or payload) == summarize_payload(payload)
    assert orjson.dumps(entity) == before
    assert summarize_payload(summary or payload) == (summary or payload)


async def test_a_large_body_is_written_in_pieces_and_updated_in_place(tmp_path: Path) -> None:
    """An item over 1 MiB goes into its row through incremental blob I/O: inserted, grown,
    shrunk to a few bytes, its row always holds exactly the entity's JSON, it is counted
    once, and when the database is full its write is held and then commits whole."""
    from test_store_unavailable import _cap_pages, _lost, _running_turn

    from t3d.domain import commands as c
    from t3d.domain.model import TurnItem
    from t3d.store.store import open_store

    def item(text: str) -> TurnItem:
        return TurnItem("u0-big", "t-u0", "u0", 0, "command", "running", None, text, {"output": text[:10]}, 0.0)

    async def body(store: Any) -> bytes:
        return await store.read(lambda conn: conn.execute("SELECT body FROM items WHERE id = 'u0-big'").get, bytes)

    with trio.fail_after(60):
        async with open_store(tmp_path / "db", on_writer_lost=_lost) as store:
            await _running_turn(store, tmp_path)
            counted = await store.read(lambda conn: conn.execute("SELECT items FROM turn_counts WHERE turn_id = 'u0'").get, int)
            for text in ("a" * 2_000_000, "b" * 3_500_000, "c"):
                committed = await store.record(c.RecordItems("u0", (item(text),)))
                stored = orjson.loads(await body(store))
                assert stored == orjson.loads(orjson.dumps(committed.events[0].entity, default=_fields))
                assert stored["text"] == text and stored["ordinal"] == counted + 1
            counts = await store.read(lambda conn: conn.execute("SELECT items FROM turn_counts WHERE turn_id = 'u0'").get, int)
            assert counts == counted + 1

            await _cap_pages(store)
            # Larger than the pages the shrink freed, so it needs new ones.
            pending = await store.send(c.RecordItems("u0", (item("d" * 6_000_000),)))
            await trio.sleep(0.5)
            assert store.statistics().writes_held == 1
            assert orjson.loads(await body(store))["text"] == "c"
            await _cap_pages(store, 1 << 30)
            await pending.outcome()
            assert orjson.loads(await body(store))["text"] == "d" * 6_000_000
            assert await store.read(lambda conn: conn.execute("PRAGMA integrity_check").get, str) == "ok"
