"""``python -m bench.large_lines``: what large provider lines cost the daemon in memory and on disk.

    python -m bench.large_lines --lines 3 --mib 30

Starts ``t3d serve`` on a fresh state dir with a fake ``claude`` that answers each turn
with ONE assistant line of ``--mib`` MiB of text (under the 32 MiB line cap), runs
``--lines`` such turns at once on as many threads, and prints one JSON object: the
daemon's RSS before, at peak (VmHWM) and 3 s after the turns ended, the bytes stored in
events and in item rows, the database's size, and whether ``item.detail`` returned each
text whole. Takes well under a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import apsw

_FAKE = r'''
import json, sys, uuid
size = int(float(sys.argv[1]) * 1024 * 1024)
out = sys.stdout.buffer
def emit(obj):
    out.write(json.dumps(obj).encode() + b"\n"); out.flush()
for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if message.get("type") == "control_request":
        emit({"type": "control_response", "response": {"subtype": "success", "request_id": message.get("request_id")}})
        continue
    if message.get("type") != "user":
        continue
    emit({"type": "system", "subtype": "init", "session_id": str(uuid.uuid4()), "model": "fake", "cwd": ".", "tools": []})
    text = ("0123456789abcdef" * (size // 16 + 1))[:size]
    emit({"type": "assistant", "message": {"id": "msg_" + uuid.uuid4().hex, "role": "assistant", "content": [{"type": "text", "text": text}]}})
    del text
    emit({"type": "result", "subtype": "success", "is_error": False, "result": "ok", "usage": {}})
'''


def _rss(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


class _Api:
    def __init__(self, port: int, token: str) -> None:
        self._url = f"http://127.0.0.1:{port}"
        self._token = token
        self._ids = 0

    def call(self, method: str, **params: Any) -> Any:
        self._ids += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}).encode()
        request = urllib.request.Request(
            self._url + "/api/dispatch", body, {"Authorization": f"Bearer {self._token}"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
        if "error" in reply:
            raise SystemExit(f"{method} failed: {reply['error']}")
        return reply["result"]


def run(lines: int, mib: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="t3d-large-lines-") as tmp:
        root = Path(tmp)
        fake = root / "fake_claude.py"
        fake.write_text(_FAKE)
        binary = root / "claude"
        binary.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{fake}' {mib} \"$@\"\n")
        binary.chmod(0o755)
        (root / "project").mkdir()
        state = root / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "t3d", "serve", "--port", "0", "--state-dir", str(state), "--claude-bin", str(binary),
             "--checkpoints", "off"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            assert daemon.stderr is not None
            seen = b""
            while not (m := re.search(rb"serving on http://127\.0\.0\.1:(\d+)", seen)):
                chunk = daemon.stderr.readline()
                if not chunk:
                    raise SystemExit(f"t3d serve did not start:\n{seen.decode(errors='replace')}")
                seen += chunk
            api = _Api(int(m.group(1)), (state / "auth" / "token").read_text().strip())
            project = api.call("project.create", path=str(root / "project"))["project_id"]
            threads = [api.call("thread.create", project_id=project, provider="claude")["thread_id"] for _ in range(lines)]
            time.sleep(1.0)
            before = _rss(daemon.pid)["VmRSS"]
            turns = [api.call("turn.start", thread_id=t, text="big")["turn_id"] for t in threads]
            db = apsw.Connection(str(state / "t3d.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
            deadline = time.monotonic() + 300
            while True:
                marks = ",".join("?" * len(turns))
                statuses = [s for (s,) in db.execute(f"SELECT status FROM turns WHERE id IN ({marks})", turns)]
                if all(s in ("completed", "failed", "interrupted", "cancelled") for s in statuses):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"turns did not end: {statuses}")
                time.sleep(0.05)
            time.sleep(3.0)
            after = _rss(daemon.pid)
            items = [
                (item_id, length)
                for item_id, length in db.execute(
                    "SELECT id, length(body) FROM items WHERE id IN (SELECT entity_id FROM events WHERE kind = 'item.updated') "
                    "ORDER BY length(body) DESC LIMIT ?",
                    (lines,),
                )
            ]
            whole = []
            for item_id, _ in items:
                value = api.call("item.detail", item_id=item_id, path=["text"])["value"]
                whole.append(len(value) == int(mib * 1024 * 1024))
            result = {
                "lines": lines,
                "mib_per_line": mib,
                "turn_statuses": statuses,
                "rss_before_mb": round(before / 1e6, 1),
                "rss_peak_mb": round(after["VmHWM"] / 1e6, 1),
                "rss_after_mb": round(after["VmRSS"] / 1e6, 1),
                "event_payload_mb": round(db.execute("SELECT sum(length(payload)) FROM events").get / 1e6, 2),
                "item_rows_mb": round(db.execute("SELECT sum(length(body)) FROM items").get / 1e6, 2),
                "db_file_mb": round(sum(p.stat().st_size for p in state.glob("t3d.sqlite*")) / 1e6, 1),
                "item_detail_whole": whole,
            }
            db.close()
            return result
        finally:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.large_lines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=3, help="turns at once, each one large line (default 3)")
    parser.add_argument("--mib", type=float, default=30.0, help="MiB of text per line (default 30; the cap is 32)")
    args = parser.parse_args()
    print(json.dumps(run(args.lines, args.mib)))


if __name__ == "__main__":
    main()
