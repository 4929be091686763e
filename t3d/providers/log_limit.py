"""Rate-limited warnings for one provider session, so a provider that floods bad output
cannot flood the log (and the loop that writes it).

Rules:
- Per window of `INTERVAL_S` seconds, the first `BURST` warnings are logged in full;
  the rest are counted, and one summary line gives their count and the last of them.
- The summary is written when the next warning comes after the window, or at `flush`
  (the session calls it when a turn ends and when it stops), whichever is first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

BURST = 5
INTERVAL_S = 60.0


class LogLimiter:
    def __init__(
        self,
        log: logging.Logger,
        prefix: str,
        *,
        burst: int = BURST,
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        level: int = logging.WARNING,
    ) -> None:
        self._log = log
        self._level = level
        self._prefix = prefix
        self._burst = burst
        self._interval = interval
        self._clock = clock
        self._window_start = -interval
        self._logged = 0
        self._suppressed = 0
        self._last = ""

    def warning(self, message: str) -> None:
        """Log ``message`` (at the limiter's level), or count it if over the burst."""
        now = self._clock()
        if now - self._window_start >= self._interval:
            self.flush()
            self._window_start, self._logged = now, 0
        if self._logged < self._burst:
            self._logged += 1
            self._log.log(self._level, "%s: %s", self._prefix, message)
            return
        self._suppressed += 1
        self._last = message

    def flush(self) -> None:
        """Log the summary of what was held back, if anything was."""
        if self._suppressed:
            self._log.log(
                self._level,
                "%s: %d more like that in the last %.0f s (the last: %s)",
                self._prefix,
                self._suppressed,
                max(self._clock() - self._window_start, 0.0),
                self._last,
            )
            self._suppressed, self._last = 0, ""
