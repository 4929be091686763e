"""GcPauses: collections are counted and timed while installed, and the hook goes after."""

from __future__ import annotations

import gc

from t3d.gc_tuning import GcPauses


def test_collections_are_counted_and_timed_while_installed_only() -> None:
    """Three full collections inside show as three generation-2 collections with a pause;
    one after leaving is not counted and the hook is gone from gc.callbacks."""
    pauses = GcPauses()
    with pauses.installed():
        for _ in range(3):
            gc.collect()
    gc.collect()
    report = pauses.statistics()
    assert report["generations"][2]["collections"] == 3
    assert 0 < report["generations"][2]["pause_ms_max"] <= report["generations"][2]["pause_ms_total"]
    assert all(callback.__self__ is not pauses for callback in gc.callbacks if hasattr(callback, "__self__"))
