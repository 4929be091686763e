"""t3d/store/packing.py: a cold item's body packed and read back exactly."""

from __future__ import annotations

import os

import orjson

from t3d.store.packing import PACK_MIN_BYTES, pack, unpack


def test_a_body_packs_and_unpacks_to_the_same_bytes_and_plain_json_reads_as_it_is() -> None:
    """A compressible JSON body packs smaller, never starting with '{', and unpacks to the
    same bytes; plain JSON (and JSON text SQL returned) reads unchanged."""
    body = orjson.dumps({"id": "u:1", "text": "the same words again " * 40})
    packed = pack(body)
    assert packed is not None and len(packed) < len(body) / 4 and packed[:1] != b"{"
    assert unpack(packed) == body
    assert unpack(body) == body
    assert unpack(body.decode()) == body


def test_small_and_incompressible_bodies_stay_plain() -> None:
    """Under PACK_MIN_BYTES, or saving less than a tenth, or not a JSON object: no packing."""
    assert pack(orjson.dumps({"text": "x" * (PACK_MIN_BYTES - 20)})) is None
    assert pack(b"{" + os.urandom(1000)) is None  # random bytes: zlib saves nothing
    assert pack(b"[" + b"1," * 500 + b"1]") is None  # not an object
