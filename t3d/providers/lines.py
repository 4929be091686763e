"""Newline framing for a provider CLI's stdout. Sans-IO, provider-agnostic.

Theory of operation
-------------------
Provider CLIs (Claude Code stream-json, Codex app-server) write one JSON
value per line on stdout. `LineBuffer` cuts those bytes, in whatever chunks
they arrive, into lines; each provider's protocol module parses the lines.
This module does no I/O and knows nothing of any provider's messages.

Rules
-----
* **Bounded.** `LineBuffer` holds at most ``max_line`` bytes of an unfinished
  line. A longer line is discarded up to its newline and reported in place
  as a `LineTooLong` item; the lines after it come out normally.
* **Reported, not raised.** `LineTooLong` is a `ProtocolError` (the peer broke
  the framing) that the caller receives as a value and may log or raise.
"""

from __future__ import annotations

from t3d.errors import ProtocolError

DEFAULT_MAX_LINE = 32 * 1024 * 1024
"""Largest stdout line kept, in bytes. Hook output can reach tens of KB (PROTOCOLS.md §1.7)."""

_PREVIEW_CHARS = 200


def preview_line(line: bytes) -> str:
    """The start of ``line`` for an error message, readable whatever its bytes."""
    text = line[: _PREVIEW_CHARS * 4].decode("utf-8", errors="replace")
    suffix = "…" if len(text) > _PREVIEW_CHARS or len(line) > _PREVIEW_CHARS * 4 else ""
    return repr(text[:_PREVIEW_CHARS]) + suffix


class LineTooLong(ProtocolError):
    """A stdout line exceeded `LineBuffer`'s limit and was dropped.

    `LineBuffer` returns this in the place of the line rather than raising
    it, so the lines before and after it still come out. The caller decides:
    log it and go on, or ``raise`` it to fail the session.
    """

    def __init__(self, length: int, limit: int, head: bytes) -> None:
        super().__init__(
            f"the provider wrote a stdout line of {length} bytes, over the limit of "
            f"{limit} bytes, so it was dropped; it began {preview_line(head)}. "
            "Raise the line limit if such lines are expected."
        )
        self.length = length
        self.limit = limit
        self.head = head


class LineBuffer:
    """Newline framing for a provider CLI's stdout.

    `feed` returns the lines completed by a chunk, without their ``\\n`` or
    ``\\r\\n``, and keeps the unfinished tail. Empty lines are skipped.
    ``max_line`` bounds the bytes before a newline (a ``\\r`` included); a
    line over it is discarded as its bytes arrive, so memory stays bounded,
    and comes out as a `LineTooLong` in its place.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be positive, not {max_line}")
        self._max_line = max_line
        self._partial = bytearray()
        # While an over-long line is being discarded: its length so far, and
        # its first bytes for the report. None otherwise.
        self._dropped: int | None = None
        self._dropped_head = b""

    def feed(self, data: bytes | bytearray) -> list[bytes | LineTooLong]:
        """Add ``data`` (as trio's ``receive_some`` returns it) and return every line it completes."""
        lines: list[bytes | LineTooLong] = []
        view = memoryview(data)
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            self._append(view[start:end])
            line = self._take()
            if line is not None:
                lines.append(line)
            start = end + 1
        self._append(view[start:])
        return lines

    def complete(self, data: bytes, begin: int, end: int) -> bytes | LineTooLong | None:
        """The line that ``data[begin:end]`` completes (a newline is at ``end``), as `feed`
        of ``data[begin:end + 1]`` would return it: without its ``\r``, None when empty.
        With nothing held from an earlier chunk, the line is one slice of ``data``."""
        if self._dropped is not None or self._partial:
            self._append(memoryview(data)[begin:end])
            return self._take()
        if end - begin > self._max_line:
            return LineTooLong(end - begin, self._max_line, data[begin : begin + _PREVIEW_CHARS])
        if end > begin and data[end - 1] == 13:  # b"\r"
            end -= 1
        return data[begin:end] if end > begin else None

    def eof(self) -> bytes | LineTooLong | None:
        """The final line if the stream ended without a newline, else ``None``; resets the buffer."""
        return self._take()

    def _append(self, piece: memoryview) -> None:
        if self._dropped is not None:
            self._dropped += len(piece)
            return
        size = len(self._partial) + len(piece)
        if size > self._max_line:
            head = bytes(self._partial[:_PREVIEW_CHARS]) + bytes(piece[:_PREVIEW_CHARS])
            self._dropped = size
            self._dropped_head = head[:_PREVIEW_CHARS]
            self._partial = bytearray()
            return
        self._partial += piece

    def _take(self) -> bytes | LineTooLong | None:
        if self._dropped is not None:
            too_long = LineTooLong(self._dropped, self._max_line, self._dropped_head)
            self._dropped = None
            self._dropped_head = b""
            return too_long
        line = bytes(self._partial)
        self._partial = bytearray()
        line = line.removesuffix(b"\r")
        return line or None
