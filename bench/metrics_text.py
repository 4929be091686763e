"""Reading a GET /metrics body (the Prometheus text format) for the bench's figures:
unlabelled samples, and histograms as cumulative buckets, their deltas over a window and
their quantiles. Pure.
"""

from __future__ import annotations


def counter_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample ``name`` in a Prometheus text body, or None."""
    lead = name + " "
    for line in text.splitlines():
        if line.startswith(lead):
            return float(line[len(lead):])
    return None


def histogram_buckets(text: str, name: str) -> list[tuple[float, float]]:
    """A Prometheus text body's histogram ``name`` as (le, cumulative count), every label
    set (but ``le``) summed, by ascending ``le`` (+Inf last); [] if it is absent."""
    lead = name + "_bucket{"
    sums: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(lead):
            continue
        labels, _, value = line[len(lead):].rpartition("} ")
        le = next((part[4:-1] for part in labels.split(",") if part.startswith('le="')), None)
        if le is None:
            continue
        bound = float("inf") if le == "+Inf" else float(le)
        sums[bound] = sums.get(bound, 0.0) + float(value)
    return sorted(sums.items())


def bucket_deltas(start: list[tuple[float, float]], end: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``end`` minus ``start`` per bucket (a bucket absent at the start counts 0 there)."""
    before = dict(start)
    return [(le, count - before.get(le, 0.0)) for le, count in end]


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of cumulative buckets, interpolated linearly inside its bucket
    (as Prometheus' histogram_quantile); in the +Inf bucket, the highest finite bound.
    None with no observation."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower
