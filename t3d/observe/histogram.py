"""A fixed-bucket histogram and a family of them by label values. Pure: no trio, no locks.

`observe` costs one bisect and three additions, so it can sit on hot paths (every
committed batch, every loop-lag sample). Values are read at scrape time; the writer of a
histogram is one thread at a time (the loop, or the collector for GC pauses), so counts
never go backwards, though one read may see a sum a moment ahead of its count.
Bounded: one list of counts per label combination, and the combinations a family can
hold are bounded by `Histograms.max_series` (beyond it, observations go to the
``other`` series).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

OTHER = "other"


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le is inclusive).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) per bucket, +Inf last, as the exposition wants them."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((_le(bound), running))
        return out


def _le(bound: float) -> str:
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))


class Histograms:
    """Histograms by a tuple of label values, made on first use."""

    def __init__(self, bounds: Sequence[float], *, max_series: int = 64) -> None:
        self.bounds = tuple(bounds)
        self.max_series = max_series
        self.series: dict[tuple[str, ...], Histogram] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        histogram = self.series.get(labels)
        if histogram is None:
            if len(self.series) >= self.max_series:
                labels = tuple(OTHER for _ in labels)
            histogram = self.series.setdefault(labels, Histogram(self.bounds))
        histogram.observe(value)
