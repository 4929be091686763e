"""Admission: the saturation gate and the active-turn cap (docs/architecture.md, Running turns)."""
