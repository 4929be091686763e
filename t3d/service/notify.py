"""systemd's notify protocol, by hand: ``READY=1``, ``STATUS=``, ``WATCHDOG=1``, ``STOPPING=1``.

The protocol is newline-separated ``KEY=VALUE`` lines in one datagram to the AF_UNIX
socket named by ``NOTIFY_SOCKET`` (a path, or an abstract name when it starts with
``@``). ``WATCHDOG_USEC`` asks for ``WATCHDOG=1`` at least that often, from the process
named by ``WATCHDOG_PID`` when that is set.

Rules:
- `notify_target` and the message builders are pure.
- `Notifier.send_nowait` never blocks: a datagram the manager cannot take at once is
  dropped and counted (the next STATUS or WATCHDOG stands in for it).
- `run_notify` is a task on the daemon's own event loop: ``WATCHDOG=1`` goes out at half
  the interval only while the loop runs, so a stuck loop misses it and systemd restarts
  the daemon, not a live one. ``STATUS=`` is sent when it changes (checked every
  `STATUS_EVERY_S`); ``STOPPING=1`` when the task is cancelled, i.e. the daemon stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping

import attrs
import trio

log = logging.getLogger("t3d")

STATUS_EVERY_S = 5.0
MAX_STATUS_CHARS = 400
# Pings at most this often, however short WatchdogSec= is (a shorter one cannot be kept anyway).
MIN_WATCHDOG_EVERY_S = 0.05


@attrs.frozen
class NotifyTarget:
    # A filesystem path, or "\0name" for an abstract socket.
    address: str
    # Seconds between WATCHDOG=1 messages (half of WATCHDOG_USEC); None: no watchdog.
    watchdog_every_s: float | None


def notify_target(environ: Mapping[str, str], pid: int) -> NotifyTarget | None:
    """Where and how often to notify, from the environment systemd gives ``pid``. Pure."""
    raw = environ.get("NOTIFY_SOCKET", "")
    if raw.startswith("@"):
        address = "\0" + raw[1:]
    elif raw.startswith("/"):
        address = raw
    else:
        return None  # unset, or a kind of address (vsock:...) this module does not speak
    every: float | None = None
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    if not watchdog_pid or watchdog_pid == str(pid):
        try:
            usec = int(environ.get("WATCHDOG_USEC", ""))
        except ValueError:
            usec = 0
        every = max(MIN_WATCHDOG_EVERY_S, usec / 2e6) if usec > 0 else None
    return NotifyTarget(address, every)


def status_message(text: str) -> str:
    """``STATUS=text`` on one line (the protocol is line-based), bounded."""
    return "STATUS=" + " ".join(text.split())[:MAX_STATUS_CHARS]


def ready_message(status: str) -> str:
    return f"READY=1\n{status_message(status)}"


WATCHDOG = "WATCHDOG=1"
STOPPING = "STOPPING=1"


class Notifier:
    """A datagram socket to the service manager's notify socket."""

    def __init__(self, target: NotifyTarget) -> None:
        self.target = target
        self.sent = 0
        self.dropped = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self._complained = False

    def send_nowait(self, message: str) -> bool:
        """Send one message; False (and counted) when it could not go out at once."""
        try:
            self._sock.sendto(message.encode(), self.target.address)
        except OSError as exc:
            self.dropped += 1
            if not self._complained:
                self._complained = True
                where = self.target.address.replace("\0", "@")
                log.warning("cannot notify the service manager at %s (%s); carrying on", where, exc)
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        self._sock.close()


async def run_notify(
    notifier: Notifier,
    status: Callable[[], str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """READY=1 with the status now, then WATCHDOG=1 and STATUS= changes until cancelled;
    STOPPING=1 on the way out."""
    last = status()
    notifier.send_nowait(ready_message(last))
    task_status.started()
    watchdog = notifier.target.watchdog_every_s
    now = trio.current_time()
    next_status = now + STATUS_EVERY_S
    next_watchdog = now + watchdog if watchdog else float("inf")
    if watchdog:
        notifier.send_nowait(WATCHDOG)
    try:
        while True:
            await trio.sleep_until(min(next_status, next_watchdog))
            now = trio.current_time()
            if now >= next_watchdog and watchdog:
                notifier.send_nowait(WATCHDOG)
                next_watchdog = now + watchdog
            if now >= next_status:
                text = status()
                if text != last:
                    notifier.send_nowait(status_message(text))
                    last = text
                next_status = now + STATUS_EVERY_S
    finally:
        notifier.send_nowait(STOPPING)
        with contextlib.suppress(OSError):
            notifier.close()


def open_notifier(environ: Mapping[str, str]) -> Notifier | None:
    """A notifier when systemd asked for notifications (``NOTIFY_SOCKET``), else None."""
    target = notify_target(environ, os.getpid())
    return Notifier(target) if target is not None else None
