"""Snapshots as bounded pieces of pre-encoded JSON. Pure.

A snapshot is `Parts`: a few head fields (``sequence``, ``thread``...) and
list elements (turns, items, requests; or projects, threads) in streaming
order, each already encoded (the bytes read from the database, summarized).
Nothing here decodes an entity.

Two shapes come out of the same parts:
- `chunk_objects`: WebSocket ``snapshot.chunk`` payloads. Each is a JSON
  object holding every list name (lists possibly empty); the first one also
  holds the head fields. A client concatenates the lists of all chunks, in
  order. Each is at most `CHUNK_DATA_BYTES`, so that with its notification
  envelope it stays within `CHUNK_BYTES`; a chunk always holds at least one
  element, and summarized entities are far smaller than a chunk.
- `object_pieces`: one JSON object (head fields, then each list whole), cut
  into byte pieces of at most `CHUNK_BYTES` for an HTTP body written piece by
  piece.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

CHUNK_BYTES = 256 * 1024
# Room for the notification envelope around a chunk: {"jsonrpc":"2.0","method":"sub",
# "params":{"sub":...,"kind":"snapshot.chunk","seq":...,"data":<chunk>}}.
ENVELOPE_ROOM = 1024
CHUNK_DATA_BYTES = CHUNK_BYTES - ENVELOPE_ROOM


@attrs.frozen
class Parts:
    # (name, encoded value), in object order: e.g. ("sequence", b"42"), ("thread", b"{...}").
    head: tuple[tuple[str, bytes], ...]
    # The list names, in object order.
    lists: tuple[str, ...]
    # (index into ``lists``, encoded element), in streaming order.
    elements: tuple[tuple[int, bytes], ...]


def _field(name: str, value: bytes) -> bytes:
    return b'"%s":%s' % (name.encode(), value)


def chunk_objects(parts: Parts, budget: int = CHUNK_DATA_BYTES) -> list[bytes]:
    """The snapshot as chunk objects of at most ``budget`` bytes each (at least one chunk)."""
    return list(_chunks(parts, budget))


def _chunks(parts: Parts, budget: int) -> Iterator[bytes]:
    # An upper bound of the size of an object with every list empty: braces, then
    # '"name":[]' and a comma per list (the sizes below may count one comma too many).
    empty_lists = sum(len(name) + 6 for name in parts.lists)
    head = [_field(name, value) for name, value in parts.head]
    head_size = sum(len(f) + 1 for f in head)
    lists: list[list[bytes]] = [[] for _ in parts.lists]
    size, count = 2 + empty_lists + head_size, 0
    for index, element in parts.elements:
        grown = len(element) + (1 if lists[index] else 0)
        if count and size + grown > budget:
            yield _chunk(head, parts.lists, lists)
            head, lists = [], [[] for _ in parts.lists]
            size, count = 2 + empty_lists, 0
            grown = len(element)
        lists[index].append(element)
        size += grown
        count += 1
    yield _chunk(head, parts.lists, lists)


def _chunk(head: list[bytes], names: tuple[str, ...], lists: list[list[bytes]]) -> bytes:
    fields = [*head, *(_field(n, b"[" + b",".join(elems) + b"]") for n, elems in zip(names, lists, strict=True))]
    return b"{" + b",".join(fields) + b"}"


def object_pieces(parts: Parts, budget: int = CHUNK_BYTES) -> list[bytes]:
    """The snapshot as one JSON object, in pieces of at most ``budget`` bytes."""
    out = _PieceWriter(budget)
    out.write(b"{")
    for n, (name, value) in enumerate(parts.head):
        out.write(b"," if n else b"")
        out.write(_field(name, value))
    for index, name in enumerate(parts.lists):
        out.write(b"," if parts.head or index else b"")
        out.write(b'"%s":[' % name.encode())
        first = True
        for list_index, element in parts.elements:
            if list_index == index:
                out.write(element if first else b"," + element)
                first = False
        out.write(b"]")
    out.write(b"}")
    return out.finish()


def object_bytes(parts: Parts) -> bytes:
    """The snapshot as one JSON object."""
    return b"".join(object_pieces(parts, budget=1 << 62))


class _PieceWriter:
    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._pieces: list[bytes] = []
        self._current = bytearray()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self._budget - len(self._current)
            self._current += view[:room]
            view = view[room:]
            if len(self._current) >= self._budget:
                self._pieces.append(bytes(self._current))
                self._current = bytearray()

    def finish(self) -> list[bytes]:
        if self._current or not self._pieces:
            self._pieces.append(bytes(self._current))
        return self._pieces
