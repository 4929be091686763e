"""JSON-RPC 2.0 codec and parameter checking. Pure: no trio, no apsw.

`parse_request` turns one frame into a `Request` or raises `RpcError` with
the reply to send. `Params` reads a request's params and collects every bad
field, so one error names all of them at once; a param the method never read
is refused by `Params.check` as unknown (a misspelled ``titel`` must not
silently do nothing).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Sequence
from typing import Any

import attrs
import orjson

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Application errors (the domain's codes).
NOT_FOUND = -32001
CONFLICT = -32002
UNAVAILABLE = -32003

DOMAIN_CODES = {"not_found": NOT_FOUND, "conflict": CONFLICT, "invalid": INVALID_PARAMS}

RequestId = str | int | None


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.request_id = request_id


@attrs.frozen
class Request:
    id: RequestId
    method: str
    params: dict[str, Any]

    @property
    def is_notification(self) -> bool:
        return self.id is None


def parse_request(frame: str | bytes) -> Request:
    try:
        message = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise RpcError(PARSE_ERROR, f"the frame is not valid JSON ({exc}); send one JSON-RPC 2.0 object per frame") from None
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "the frame is not a JSON object; send one JSON-RPC 2.0 request object per frame (batches are not supported)")
    request_id = message.get("id")
    if request_id is not None and (not isinstance(request_id, (str, int)) or isinstance(request_id, bool)):
        raise RpcError(INVALID_REQUEST, "id must be a string or an integer")
    if message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'the request lacks "jsonrpc": "2.0"', request_id=request_id)
    method = message.get("method")
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, 'the request lacks a "method" string', request_id=request_id)
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object with named fields", request_id=request_id)
    return Request(request_id, method, params)


def result_frame(request_id: RequestId, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def error_frame(request_id: RequestId, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def notification_frame(sub: str, kind: str, seq: int, data: bytes) -> bytes:
    """A subscription push, spliced around already-encoded ``data``."""
    return b'{"jsonrpc":"2.0","method":"sub","params":{"sub":%s,"kind":"%s","seq":%d,"data":%s}}' % (
        orjson.dumps(sub),
        kind.encode(),
        seq,
        data,
    )


def reply_chunk_frame(request_id: RequestId, seq: int, data: bytes) -> bytes:
    """One chunk of a streamed reply (``thread.snapshot``): a ``snapshot.chunk`` notification
    naming the request it answers, spliced around already-encoded ``data``."""
    return b'{"jsonrpc":"2.0","method":"snapshot.chunk","params":{"id":%s,"seq":%d,"data":%s}}' % (
        orjson.dumps(request_id),
        seq,
        data,
    )


_MISSING = object()


class Params:
    """Typed access to params; `check` raises one error naming every bad field and every
    param the method did not read (so read them all before `check`)."""

    def __init__(self, params: dict[str, Any], method: builtins.str = "") -> None:
        self._params = params
        self._method = method
        self._read: list[builtins.str] = []
        self._problems: list[str] = []

    def _get(self, name: builtins.str, kind: type | tuple[type, ...], label: builtins.str, required: bool) -> Any:
        self._seen(name)
        value = self._params.get(name, _MISSING)
        if value is _MISSING or value is None:
            if required:
                self._problems.append(f"{name} is required ({label})")
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            self._problems.append(f"{name} must be {label}, not {type(value).__name__}")
            return None
        return value

    def str(self, name: builtins.str, *, max_len: int = 4096) -> Any:
        value = self._get(name, str, "a string", True)
        return self._bounded(name, value, max_len)

    def opt_str(self, name: builtins.str, *, max_len: int = 4096) -> Any:
        value = self._get(name, str, "a string", False)
        return self._bounded(name, value, max_len)

    def opt_str_list(self, name: builtins.str, *, max_items: int, max_len: int = 4096) -> Any:
        """A list of 1 to ``max_items`` strings, or None when not given."""
        value = self._get(name, list, "a list of strings", False)
        if value is None:
            return None
        if not 1 <= len(value) <= max_items:
            self._problems.append(f"{name} must hold 1 to {max_items} strings, not {len(value)}")
            return None
        if not all(isinstance(v, str) and v for v in value):
            self._problems.append(f"{name} must hold only non-empty strings")
            return None
        if any(len(v) > max_len for v in value):
            self._problems.append(f"{name} holds a string longer than {max_len} characters")
            return None
        return value

    def _bounded(self, name: builtins.str, value: Any, max_len: int) -> Any:
        if value is not None and len(value) > max_len:
            self._problems.append(f"{name} is longer than {max_len} characters")
            return None
        return value

    def opt_int(self, name: builtins.str, *, default: int | None, low: int, high: int) -> Any:
        value = self._get(name, int, "an integer", False)
        if value is None:
            return default
        if not low <= value <= high:
            self._problems.append(f"{name} must be between {low} and {high}, not {value}")
            return default
        return value

    def opt_bool(self, name: builtins.str, *, default: bool) -> Any:
        value = self._get(name, bool, "true or false", False)
        return default if value is None else value

    def choice(self, name: builtins.str, allowed: Sequence[builtins.str], *, default: builtins.str | None = None) -> Any:
        value = self._get(name, str, f"one of {', '.join(allowed)}", default is None)
        if value is None:
            return default
        if value not in allowed:
            self._problems.append(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
            return default
        return value

    def raw(self, name: builtins.str) -> Any:
        self._seen(name)
        return self._params.get(name)

    def _seen(self, name: builtins.str) -> None:
        if name not in self._read:
            self._read.append(name)

    def fingerprint(self) -> bytes:
        """What a retry with the same ``command_id`` must repeat: the method and every param
        but ``command_id``, canonically encoded and hashed. Pure."""
        params = {k: v for k, v in self._params.items() if k != "command_id"}
        body = orjson.dumps([self._method, params], option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(body).digest()

    def check(self) -> None:
        unknown = [name for name in self._params if name not in self._read]
        if unknown:
            what = f"{self._method} takes" if self._method else "this call takes"
            takes = ", ".join(self._read) if self._read else "no params"
            names = ", ".join(repr(name) for name in unknown)
            self._problems.append(f"unknown param{'s' if len(unknown) > 1 else ''} {names}; {what} {takes}")
        if self._problems:
            raise RpcError(INVALID_PARAMS, "invalid params: " + "; ".join(self._problems), {"problems": self._problems})
