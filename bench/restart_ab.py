"""A restart's down time, A/B between two installations: ``python bench/restart_ab.py``.

    python bench/restart_ab.py --python /work/main/.venv/bin/python --python .venv/bin/python --runs 7
    python bench/restart_ab.py --python .venv/bin/python@/tmp/a --python .venv/bin/python@/tmp/b

Standard library only, so any interpreter runs it. ``PY@DIR`` runs ``PY`` with the
source tree ``DIR`` first on ``PYTHONPATH`` (e.g. a ``git archive`` of each branch, which
may be byte-compiled with ``python -m compileall DIR`` to time an installed daemon;
without ``.pyc`` files, under ``PYTHONDONTWRITEBYTECODE``, every start compiles every
module). For each installation one state dir is prepared (a first start creates the
database and the spawner, which then stays up as it does across a real restart), then
the starts alternate A B A B ...: each runs ``PY -m t3d serve`` on its state dir with a
``NOTIFY_SOCKET`` this script reads, and times from the exec to the first 200 from
``GET /api/health`` (polled every 5 ms over fresh connections) and to ``READY=1``; then
SIGTERM, timed to the process's exit (the old daemon's share of a restart's down time).
Prints the median of each, per installation, and the load average.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def one_start(install: str, state: Path, work: Path, log: BinaryIO) -> dict[str, float]:
    """Start, time to health and READY, SIGTERM, time to exit. Seconds."""
    python, _, source = install.partition("@")
    notify_path = work / f"notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.setblocking(False)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("T3D_")}
    env["NOTIFY_SOCKET"] = str(notify_path)
    if source:
        env["PYTHONPATH"] = source
    argv = [python, "-m", "t3d", "serve", "--state-dir", str(state), "--port", str(port),
            "--log-level", "warning", "--replay-speed", "0"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)  # not a checkout: -m puts the cwd first on sys.path
    times: dict[str, float] = {}
    try:
        while ("health" not in times or "ready" not in times) and time.monotonic() - started < TIMEOUT_S:
            if proc.poll() is not None:
                raise SystemExit(f"{python} -m t3d serve exited with {proc.returncode}; see {log.name}")
            try:
                while True:
                    if b"READY=1" in sock.recv(4096).split(b"\n") and "ready" not in times:
                        times["ready"] = time.monotonic() - started
            except BlockingIOError:
                pass
            if "health" not in times and health(port):
                times["health"] = time.monotonic() - started
            time.sleep(0.005)
        stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(TIMEOUT_S)
        times["stop"] = time.monotonic() - stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        notify_path.unlink(missing_ok=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", action="append", required=True, help="an installation's interpreter (repeat: A, B, ...)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--work", help="directory for the state dirs and logs (default: a new temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="t3d-restart-ab-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    samples: dict[str, dict[str, list[float]]] = {p: {"health": [], "ready": [], "stop": []} for p in args.python}
    with (work / "daemon.log").open("ab") as log:
        states = {p: work / f"state-{i}" for i, p in enumerate(args.python)}
        for python, state in states.items():
            one_start(python, state, work, log)  # creates the database and the spawner
            py, _, source = python.partition("@")
            where = subprocess.run([py, "-c", "import t3d; print(t3d.__file__)"], env={**os.environ, "PYTHONPATH": source},
                                   cwd=work, capture_output=True, text=True).stdout.strip()  # fmt: skip
            print(f"{python}: t3d from {where}")
        for run in range(args.runs):
            for python in args.python if run % 2 == 0 else reversed(args.python):
                for key, value in one_start(python, states[python], work, log).items():
                    samples[python][key].append(value)
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for python, figures in samples.items():
        line = ", ".join(
            f"{key} median {statistics.median(v) * 1000:,.0f} ms (min {min(v) * 1000:,.0f}, max {max(v) * 1000:,.0f})"
            for key, v in figures.items()
        )
        print(f"{python}: {line} over {args.runs} starts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
