"""The summarized form of a large entity: what the wire shows and what an event keeps. Pure.

Rules:
- An entity whose stored payload is at most `FIELD_LIMIT` bytes is its own
  summary: the same bytes object, never decoded (the common case costs one
  length check).
- In a larger one, every string over `FIELD_LIMIT` UTF-8 bytes, wherever it
  sits (command output, file bodies, tool results, long text), is cut to its
  first `HEAD_BYTES` bytes at a character boundary and listed in the entity's
  ``truncated`` field as ``{"path": [...], "bytes": <full size>}``.
  ``item.detail`` returns the full value of any listed path.
- The ``text`` of a message item (user, assistant, reasoning) is what a user
  reads as it streams, so it is kept up to `TEXT_LIMIT` and only beyond that
  cut (to its first `TEXT_LIMIT` bytes, listed likewise).
- An entity still over `ENTITY_LIMIT` after that (many mid-sized fields),
  message text aside, has its largest top-level containers replaced by
  ``null``, then its top-level strings cut to `HEAD_BYTES`, each listed
  likewise. So every summary is at most about `ENTITY_LIMIT` (plus a
  message's text, at most `TEXT_LIMIT`), and a snapshot chunk always holds one.
- The functions are deterministic: the same payload gives the same bytes,
  whether it goes out live, in a replay or in a snapshot. A summary (it has
  ``truncated``) is its own summary, so an event that stores one (commit.py,
  for an entity over `commit.STORE_ONCE_BYTES`) replays as it went out live.
"""

from __future__ import annotations

from typing import Any

import orjson

from t3d.domain.codec import dumps_sized

FIELD_LIMIT = 16 * 1024
HEAD_BYTES = 4 * 1024
ENTITY_LIMIT = 64 * 1024
TEXT_LIMIT = 128 * 1024
MESSAGE_KINDS = frozenset({"user_message", "assistant_message", "reasoning"})

Path = list[str | int]


def summarize_payload(payload: bytes) -> bytes:
    """``payload`` itself if nothing in it is large, else its summarized encoding."""
    if len(payload) <= FIELD_LIMIT:
        return payload
    entity = orjson.loads(payload)
    if not isinstance(entity, dict) or "truncated" in entity:  # not an entity, or a summary already
        return payload
    return summarize_value(entity, len(payload)) or payload


def summarize_value(entity: dict[str, Any], size: int) -> bytes | None:
    """The summary of an entity given as a JSON value (``size``: the bytes of its encoding),
    encoded; None when nothing in it is large (the entity is its own summary). ``entity`` is
    cut in place: pass a fresh value (`json_copy`). The same bytes `summarize_payload` gives
    for its encoding, without decoding (copying) its large strings."""
    cut = summarize_entity(entity, large=size > ENTITY_LIMIT)
    return dumps_sized(entity) if cut else None


def json_copy(value: Any) -> Any:
    """``value`` as ``orjson.loads(orjson.dumps(value))`` gives it (tuples become lists), but
    sharing its strings: only the containers are new (no recursion)."""
    root: list[Any] = [value]
    stack: list[tuple[dict[Any, Any] | list[Any], Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        item = parent[key]
        if isinstance(item, dict):
            parent[key] = copied = dict(item)
            stack.extend((copied, k) for k in copied)
        elif isinstance(item, (list, tuple)):
            parent[key] = copied_list = list(item)
            stack.extend((copied_list, i) for i in range(len(copied_list)))
    return root[0]


def summarize_entity(entity: dict[str, Any], *, large: bool = True) -> list[dict[str, Any]]:
    """Summarize ``entity`` in place; return what was cut (also set as ``entity["truncated"]``).
    ``large=False`` promises the entity encodes to at most ENTITY_LIMIT (a cheaper path)."""
    # Stored sizes of the top-level containers, in case one must go whole (cutting strings
    # first would make them look smaller than what item.detail returns).
    containers = _container_sizes(entity) if large else {}
    message_text = entity.get("text") if entity.get("kind") in MESSAGE_KINDS else None
    if isinstance(message_text, str):
        entity["text"] = ""  # held aside (in place, to keep the key order)
    cut = _cut_long_strings(entity, FIELD_LIMIT)
    size = len(orjson.dumps(entity))
    if size > ENTITY_LIMIT:
        size = _drop_large_containers(entity, size, containers, cut)
    if size > ENTITY_LIMIT:
        for key, value in entity.items():
            if isinstance(value, str) and _utf8_size(value) > HEAD_BYTES:
                cut.append({"path": [key], "bytes": _utf8_size(value)})
                entity[key] = _head(value)
    if isinstance(message_text, str):
        if len(message_text) * 4 > TEXT_LIMIT and (size := _utf8_size(message_text)) > TEXT_LIMIT:
            cut.append({"path": ["text"], "bytes": size})
            message_text = _head(message_text, TEXT_LIMIT)
        entity["text"] = message_text
    if cut:
        entity["truncated"] = cut
    return cut


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _head(text: str, size: int = HEAD_BYTES) -> str:
    return text.encode()[:size].decode("utf-8", "ignore")


def _cut_long_strings(root: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """Cut every string over ``limit`` bytes in ``root`` (any depth, no recursion) to its head."""
    cut: list[dict[str, Any]] = []
    stack: list[tuple[dict[str, Any] | list[Any], Path]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        pairs: list[tuple[Any, Any]] = list(node.items() if isinstance(node, dict) else enumerate(node))
        for key, value in pairs:
            if isinstance(value, str):
                # A string of n characters has at most 4n bytes: most need no encoding to know.
                if len(value) * 4 > limit and (size := _utf8_size(value)) > limit:
                    cut.append({"path": [*path, key], "bytes": size})
                    node[key] = _head(value)
            elif isinstance(value, (dict, list)):
                stack.append((value, [*path, key]))
    cut.sort(key=lambda c: [str(p) for p in c["path"]])
    return cut


def _container_sizes(entity: dict[str, Any]) -> dict[str, int]:
    return {k: len(orjson.dumps(v)) for k, v in entity.items() if isinstance(v, (dict, list))}


def _drop_large_containers(
    entity: dict[str, Any], size: int, stored: dict[str, int], cut: list[dict[str, Any]]
) -> int:
    """Replace the largest top-level containers by null until the entity fits; ``stored``
    holds their sizes before any string in them was cut."""
    now = sorted(((len(orjson.dumps(entity[k])), k) for k in stored), reverse=True)
    for bytes_now, key in now:
        if size <= ENTITY_LIMIT or bytes_now <= HEAD_BYTES:
            break
        entity[key] = None
        cut[:] = [c for c in cut if c["path"][0] != key]  # the whole container is listed instead
        cut.append({"path": [key], "bytes": stored[key]})
        size -= bytes_now - 4
    return size


def value_at(entity: Any, path: Path) -> Any:
    """The value at ``path`` in ``entity``; KeyError naming the first step that is missing."""
    value = entity
    for depth, step in enumerate(path):
        found = (isinstance(value, dict) and isinstance(step, str) and step in value) or (
            isinstance(value, list) and isinstance(step, int) and -len(value) <= step < len(value)
        )
        if not found:
            raise KeyError(f"{step!r} not found at {path[:depth]!r}")
        value = value[step]
    return value
