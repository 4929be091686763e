"""The web page's static files, shipped in the package (``t3d/web/static/``); no build step.

`load_static` reads them all once (it blocks: call it in a worker thread) into an immutable
`StaticFiles`, which answers by name; a name that is not a file of the directory as it was
read is simply not there, so no path a client sends reaches the disk.
"""

from __future__ import annotations

import hashlib
from importlib import resources

import attrs

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
}
# Files larger than this are not served (the page's own files are a few tens of KiB).
MAX_FILE_BYTES = 2 * 1024 * 1024


@attrs.frozen
class StaticFile:
    body: bytes
    content_type: str
    etag: str


@attrs.frozen
class StaticFiles:
    files: dict[str, StaticFile]

    def get(self, name: str) -> StaticFile | None:
        return self.files.get(name)


def load_static() -> StaticFiles:
    """Every file under ``static/`` with a known type, by its path relative to it (blocking)."""
    root = resources.files(__package__).joinpath("static")
    files: dict[str, StaticFile] = {}
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            name = prefix + entry.name
            if entry.is_dir():
                stack.append((entry, name + "/"))
                continue
            suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
            if suffix not in CONTENT_TYPES:
                continue
            body = entry.read_bytes()
            if len(body) > MAX_FILE_BYTES:
                continue
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            files[name] = StaticFile(body, CONTENT_TYPES[suffix], etag)
    return StaticFiles(files)
