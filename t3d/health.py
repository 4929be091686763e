"""What `/api/health` says: built from in-memory figures only (no I/O), so it answers
from the loop in microseconds even when the disk is saturated. Pure.

Status: ``failing`` while the database cannot take writes (a full disk, another
process holding its lock: the reason says which, ``writer.unavailable`` names the
directory or the process), or when the
database writer has not finished a job for `WRITER_STUCK_S` (commits are
stuck: the disk or the writer is in trouble);
``degraded`` when the admission gate is saturated, the writer's oldest job has
waited `WRITER_BEHIND_S`, or the spawner sidecar is not connected; else ``ok``.
``reasons`` says which.
"""

from __future__ import annotations

from typing import Any

WRITER_BEHIND_S = 1.0
WRITER_STUCK_S = 10.0


def health_report(
    *,
    version: str,
    uptime_s: float,
    loop_lag_ms: dict[str, float],
    writer_queue: int,
    writer_oldest_job_s: float,
    readers_busy: int,
    database_unavailable: str | None = None,
    database_unavailable_detail: str | None = None,
    database_unavailable_s: float = 0.0,
    writes_held: int = 0,
    writes_failed_unavailable: int = 0,
    admission: dict[str, Any],
    sessions: int,
    connections: int,
    spawner: dict[str, Any],
) -> dict[str, Any]:
    reasons = []
    failing = database_unavailable is not None or writer_oldest_job_s >= WRITER_STUCK_S
    if database_unavailable is not None:
        held = f"; {writes_held} provider update(s) wait to be written" if writes_held else ""
        reasons.append(f"{database_unavailable} (for {database_unavailable_s:.0f} s{held})")
    elif failing:
        reasons.append(f"the database writer has been on one job for {writer_oldest_job_s:.0f} s")
    elif writer_oldest_job_s >= WRITER_BEHIND_S:
        reasons.append(f"the database writer is behind (oldest job waiting {writer_oldest_job_s:.1f} s)")
    if admission.get("state") == "saturated":
        reasons.append("the event loop is saturated; new turns are held back")
    if spawner.get("mode") == "sidecar" and not spawner.get("connected"):
        reasons.append("the spawner sidecar is not connected; it is being restarted")
    status = "failing" if failing else "degraded" if reasons else "ok"
    return {
        "status": status,
        "reasons": reasons,
        "version": version,
        "uptime_s": round(uptime_s, 3),
        "loop_lag_ms": loop_lag_ms,
        "writer": {
            "queue": writer_queue,
            "oldest_job_s": round(writer_oldest_job_s, 3),
            "unavailable": database_unavailable_detail,
            "held": writes_held,
            "failed_unavailable": writes_failed_unavailable,
        },
        "readers_busy": readers_busy,
        "admission": admission,
        "sessions": sessions,
        "connections": connections,
        "spawner": spawner,
    }
