"""Item bodies packed once they are cold. Pure: no trio, no apsw.

An item's row holds its final state as JSON. Once retention has compacted the item's
newest event (it has not changed for the item snapshots' age; retention.py), the row is
all there is of it, and it is read only when someone opens an old turn. Retention then
stores its body packed: zlib (`pack`), kept only when that saves a tenth or more. Every
read of an item's body goes through `unpack`, which tells the two apart by their first
byte (a JSON object's is ``{``, a zlib stream's never is), so packed and plain rows mix
freely, and a later update of the item writes plain JSON again.
"""

from __future__ import annotations

import zlib

PACK_MIN_BYTES = 256  # smaller bodies are left plain: zlib's header would eat the saving
PACK_LEVEL = 6
PACK_KEEP = 0.9  # a packed body is kept only at most this share of the plain one


def pack(body: bytes) -> bytes | None:
    """``body`` (plain JSON) packed, or None when packing it would not pay."""
    if len(body) < PACK_MIN_BYTES or body[:1] != b"{":
        return None
    packed = zlib.compress(body, PACK_LEVEL)
    return packed if len(packed) <= len(body) * PACK_KEEP else None


def unpack(body: bytes | str) -> bytes:
    """The JSON of a stored body, packed or not (a body SQL rewrote, with ``json_set`` say,
    comes back as text)."""
    if isinstance(body, str):
        return body.encode()
    return body if body[:1] == b"{" else zlib.decompress(body)
