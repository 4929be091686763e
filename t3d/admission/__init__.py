"""Admission: the saturation gate and the active-turn cap (DESIGN.md §10)."""
