"""Running one short-lived command to completion (the `run` request), in a worker thread.

Rules:
- The child gets its own session (process group); a timeout KILLs the whole
  group and the reply says ``timed_out``.
- Each output stream keeps its first ``output_cap`` bytes; the rest is read
  and dropped (so the child never blocks on a full pipe) and ``truncated``
  is set.
- A child that exits while a grandchild still holds its pipes open is waited
  for at most `EOF_GRACE_S` more; the reply does not hang on the grandchild.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from typing import Any

from spawner.protocol import b64

EOF_GRACE_S = 1.0
_POLL_S = 0.25


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def run_command(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str] | None,
    stdin: bytes,
    timeout: float,
    output_cap: int,
) -> dict[str, Any]:
    """Run ``argv`` and return the reply fields. Raises OSError if it cannot start."""
    started = time.monotonic()
    popen = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    outputs: dict[int, bytearray] = {}
    truncated = False
    timed_out = False
    deadline = started + timeout
    with selectors.DefaultSelector() as selector:
        pending = memoryview(stdin)
        if popen.stdin is not None:
            os.set_blocking(popen.stdin.fileno(), False)
            selector.register(popen.stdin, selectors.EVENT_WRITE)
        for stream in (popen.stdout, popen.stderr):
            assert stream is not None
            outputs[stream.fileno()] = bytearray()
            selector.register(stream, selectors.EVENT_READ)
        exited_at: float | None = None
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and popen.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EOF_GRACE_S:
                break
            for key, _ in selector.select(min(deadline - now, _POLL_S)):
                if key.fileobj is popen.stdin:
                    try:
                        written = os.write(key.fd, pending[:65536])
                    except BrokenPipeError:
                        written = len(pending)
                    pending = pending[written:]
                    if not pending:
                        selector.unregister(key.fileobj)
                        popen.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                kept = outputs[key.fd]
                room = output_cap - len(kept)
                if room < len(chunk):
                    truncated = True
                kept += chunk[: max(room, 0)]
    if timed_out:
        kill_group(popen.pid)
    try:
        returncode = popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(popen.pid)
        returncode = popen.wait()
    assert popen.stdout is not None and popen.stderr is not None
    stdout, stderr = outputs[popen.stdout.fileno()], outputs[popen.stderr.fileno()]
    for stream in (popen.stdin, popen.stdout, popen.stderr):
        if stream is not None:
            stream.close()
    return {
        "returncode": returncode,
        "signal": signal_name(returncode),
        "stdout_b64": b64(bytes(stdout)),
        "stderr_b64": b64(bytes(stderr)),
        "truncated": truncated,
        "timed_out": timed_out,
        "duration": time.monotonic() - started,
    }
