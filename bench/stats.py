"""Percentiles, medians over runs, A/B ratios and run validity. Pure.

Percentiles interpolate linearly between the two nearest ranks (numpy's default), so
p50 of an even count is the mean of the middle two. An empty sample has no percentile
(None), never 0: a figure that could not be measured stays missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Figures = Mapping[str, Any]


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def maximum(values: Iterable[float]) -> float | None:
    return max(values, default=None)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def validity(figures: Figures, *, burst: bool) -> list[str]:
    """Why a run is invalid (empty: valid). Every session must have produced provider output
    in the window (for a burst: every turn must have completed), and the harness must have
    finished its part."""
    reasons = list(figures.get("harness_errors") or [])
    sessions = figures.get("sessions") or 0
    if burst:
        done = figures.get("turns_completed") or 0
        if done < sessions:
            reasons.append(f"{done} of {sessions} burst turns completed")
    else:
        produced = figures.get("sessions_with_output")
        if produced is None or produced < sessions:
            reasons.append(f"{produced or 0} of {sessions} sessions produced output in the window")
    return reasons


def median_figures(runs: Sequence[Figures], names: Iterable[str]) -> dict[str, float | None]:
    """For each figure, the median over ``runs`` of its numeric values (missing: None)."""
    out: dict[str, float | None] = {}
    for name in names:
        values = [
            r[name]
            for r in runs
            if isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool)
        ]
        out[name] = percentile(values, 50)
    return out
