"""Memory pressure, the pure part: PSI parsing, the level and its hysteresis, agent sizes.

No trio, no I/O. `t3d/pressure/sampler.py` reads the files and feeds this.

Theory of operation. Linux PSI (``/proc/pressure/memory``, a cgroup's
``memory.pressure``) says which share of the last 10 s some (``some``) or all
(``full``) runnable tasks stalled on memory. The level is derived from the
``avg10`` figures of the host and of the agents' cgroup:

- ``elevated``: host full >= 2 %, host some >= 10 %, or agents full >= 5 %;
- ``severe``: host full >= 10 %, or agents full >= 20 % (the agents' cgroup
  gets looser thresholds because the kernel throttles it first).

Hysteresis: a level is entered when a reading is at or above its threshold
and left only when every reading is below `EXIT_FRACTION` of the thresholds
that hold it ("well below"), so readings that hover around a threshold never
make the level flicker. A sample with no readable source keeps the level;
`PressureTracker` drops it to ``none`` once no source has been readable for
`STALE_S` seconds, so a warning cannot outlive the pressure.

Agent sizes are rounded to about an eighth of their magnitude (`round_size`) so
normal growth does not change the payload every sample; ranking uses the raw
sizes (`heaviest`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from t3d.errors import T3dError

Level = Literal["none", "elevated", "severe"]
LEVELS: tuple[Level, ...] = ("none", "elevated", "severe")

# Below this share of a threshold a level is left (entered at 100 %).
EXIT_FRACTION = 0.5
# With no readable source for this long, the level falls back to none.
STALE_S = 30.0
HEAVIEST_COUNT = 3
# PSI percentages are 0..100; a file saying more is malformed.
MAX_PERCENT = 100.0


class PsiFormatError(T3dError):
    """A PSI file does not hold what the kernel writes there."""


@attrs.frozen
class Psi:
    """One PSI file's 10 s averages, in percent."""

    some: float
    full: float


@attrs.frozen
class Thresholds:
    host_full: float
    host_some: float  # math.inf: this level does not look at it
    agents_full: float


ELEVATED = Thresholds(host_full=2.0, host_some=10.0, agents_full=5.0)
SEVERE = Thresholds(host_full=10.0, host_some=math.inf, agents_full=20.0)


@attrs.frozen
class Sample:
    """One reading of every source; None = that source could not be read (or is absent)."""

    host: Psi | None
    agents: Psi | None

    @property
    def readable(self) -> bool:
        return self.host is not None or self.agents is not None


def parse_psi(text: str) -> Psi:
    """The ``avg10`` of the ``some`` and ``full`` lines of a PSI file.

    Raises PsiFormatError naming what is wrong. A file without a ``full`` line
    (PSI of CPU on old kernels; never memory) is malformed here."""
    values: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        kind = words[0]
        if kind not in ("some", "full"):
            raise PsiFormatError(f"line {number} starts with {kind!r}, not 'some' or 'full'")
        if kind in values:
            raise PsiFormatError(f"line {number} repeats the {kind!r} line")
        fields = dict(word.partition("=")[::2] for word in words[1:])
        raw = fields.get("avg10")
        if raw is None:
            raise PsiFormatError(f"the {kind!r} line has no avg10=")
        try:
            value = float(raw)
        except ValueError:
            raise PsiFormatError(f"avg10={raw!r} on the {kind!r} line is not a number") from None
        if not 0.0 <= value <= MAX_PERCENT:  # also refuses nan
            raise PsiFormatError(f"avg10={raw!r} on the {kind!r} line is not a percentage")
        values[kind] = value
    missing = [kind for kind in ("some", "full") if kind not in values]
    if missing:
        raise PsiFormatError(f"no {' or '.join(repr(m) for m in missing)} line")
    return Psi(some=values["some"], full=values["full"])


def _reaches(sample: Sample, t: Thresholds, fraction: float) -> bool:
    """Whether any reading is at or above ``fraction`` of its threshold in ``t``."""
    host, agents = sample.host, sample.agents
    if host is not None and (
        host.full >= t.host_full * fraction or host.some >= t.host_some * fraction
    ):
        return True
    return agents is not None and agents.full >= t.agents_full * fraction


def next_level(previous: Level, sample: Sample) -> Level:
    """The level after ``sample``, given the level before it (hysteresis). Total and pure."""
    if not sample.readable:
        return previous
    if _reaches(sample, SEVERE, 1.0) or (
        previous == "severe" and _reaches(sample, SEVERE, EXIT_FRACTION)
    ):
        return "severe"
    if _reaches(sample, ELEVATED, 1.0) or (
        previous != "none" and _reaches(sample, ELEVATED, EXIT_FRACTION)
    ):
        return "elevated"
    return "none"


@attrs.define
class PressureTracker:
    """The level over time: hysteresis plus the fall back to none after `STALE_S` unreadable."""

    level: Level = "none"
    last_readable_at: float | None = None

    def observe(self, now: float, sample: Sample) -> Level:
        if sample.readable:
            self.last_readable_at = now
            self.level = next_level(self.level, sample)
        elif self.last_readable_at is None or now - self.last_readable_at >= STALE_S:
            self.level = "none"
        return self.level


def round_size(size: int) -> int:
    """``size`` rounded to a multiple of about an eighth of its magnitude (2**(bits-4)).

    Never 0 for a positive size (a 28 MB agent stays about 28 MB), and always
    within 1/16 of the raw size."""
    if size <= 0:
        return 0
    step = 1 << max(size.bit_length() - 4, 0)
    return ((size + step // 2) // step) * step


@attrs.frozen
class AgentMemory:
    thread_id: str
    size: int  # bytes: the scope's memory.current, or the process tree's PSS
    source: Literal["scope", "pss"]


def heaviest(agents: Iterable[AgentMemory], count: int = HEAVIEST_COUNT) -> list[AgentMemory]:
    """The ``count`` largest agents by raw size (ties by thread id), sizes then rounded."""
    ranked = sorted(agents, key=lambda a: (-a.size, a.thread_id))[:count]
    return [attrs.evolve(a, size=round_size(a.size)) for a in ranked]


def payload(level: Level, agents: list[AgentMemory], unavailable: str | None) -> dict[str, Any]:
    """What clients get: the level, the heaviest agents while not none, and why nothing
    can be read (only while that is so). No raw percentages: they change every sample."""
    value: dict[str, Any] = {
        "level": level,
        "agents": [
            {"thread_id": a.thread_id, "memory_bytes": a.size, "source": a.source}
            for a in (agents if level != "none" else [])
        ],
    }
    if unavailable is not None:
        value["unavailable"] = unavailable
    return value
