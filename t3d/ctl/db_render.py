"""What `t3d ctl db` prints: pure functions of the daemon's ``db.*`` results. No I/O."""

from __future__ import annotations

from typing import Any

JsonDict = dict[str, Any]

BAR_WIDTH = 30
SPINNER = "|/-\\"
AGE_COLUMNS = ("<1h", "1h-1d", "1d-7d", "7d-30d", ">30d")


def size(n: float) -> str:
    """Bytes in the largest unit that keeps the number at or above 1: 512 B, 3.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def progress_line(job: JsonDict, tick: int) -> str:
    """One line of progress: a bar when the job knows its total, else a spinner."""
    done, total = int(job.get("done") or 0), int(job.get("total") or 0)
    elapsed = f"{float(job.get('elapsed_s') or 0):.1f} s"
    phase = str(job.get("phase") or "")
    if total > 0:
        share = min(1.0, done / total)
        filled = int(share * BAR_WIDTH)
        return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {share * 100:3.0f}%  {phase}  {elapsed}"
    return f"{SPINNER[tick % len(SPINNER)]} {phase}  {elapsed}"


def table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """Columns aligned: numbers to the right, text to the left."""
    numeric = [bool(rows) and all(isinstance(row[i], int) for row in rows) for i in range(len(header))]
    cells = [header, *[tuple(f"{c:,}" if isinstance(c, int) else str(c) for c in row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def format_stats(stats: JsonDict) -> str:
    page = int(stats["page_size"])
    out = [
        f"database {stats['path']}: {size(stats['file_bytes'])} (WAL {size(stats['wal_bytes'])}), "
        f"{stats['pages']:,} pages of {size(page)}, {stats['free_pages']:,} free ({size(stats['free_pages'] * page)}), "
        f"auto-vacuum {stats['auto_vacuum']}\n",
        f"{stats['events']:,} events up to sequence {stats['sequence']:,}; "
        f"{stats['threads']:,} threads, {stats['turns']:,} turns, {stats['items']:,} items\n",
        "\nevents by kind and age:\n",
    ]
    kinds = stats["events_by_kind"]
    rows = [(kind, v["total"], *(v["by_age"][a] for a in AGE_COLUMNS)) for kind, v in sorted(kinds.items())]
    out.append(table(("kind", "total", *AGE_COLUMNS), rows))
    if stats["largest_threads"]:
        out.append("\nlargest threads:\n")
        rows = [
            (t["thread_id"], t["items"], t["turns"], t["events"], (t["title"] or "")[:40])
            for t in stats["largest_threads"]
        ]
        out.append(table(("thread", "items", "turns", "events", "title"), rows))
    retention = stats["retention"]
    cursors = ", ".join(f"{name} {value:,}" for name, value in retention["cursors"].items())
    out.append(
        f"\nretention: pruned and compacted up to sequence {cursors}; {retention['compacted']:,} compacted event(s) "
        f"(their body is their row); {retention['threads_to_purge']:,} deleted thread(s) to purge\n"
    )
    return "".join(out)


def format_prune(report: JsonDict) -> str:
    verb = "would delete" if report["dry_run"] else "deleted"
    parts = [
        f"{report['rows'].get(phase, 0):,} {phase} ({size(report['bytes'].get(phase, 0))})"
        for phase in ("item snapshots", "thread-state events", "deleted threads")
    ]
    parts.append(f"{report['rows'].get('outbox', 0):,} done outbox rows")
    compacted = [
        f"{report['compacted'].get(phase, 0):,} {phase} ({size(report['compacted_bytes'].get(phase, 0))})"
        for phase in ("item snapshots", "thread-state events")
    ]
    tail = "" if report["dry_run"] else f"; {report['free_pages']:,} pages free after vacuum"
    packed = f"{report['packed']:,} item rows ({size(report['packed_bytes'])} smaller)"
    return (
        f"{verb}: {', '.join(parts)}; {'would compact' if report['dry_run'] else 'compacted'} "
        f"{', '.join(compacted)}; {'would pack' if report['dry_run'] else 'packed'} {packed}; "
        f"in {report['elapsed_s']:.1f} s ({report['steps']:,} steps){tail}\n"
    )


def format_vacuum(result: JsonDict, page_size: int = 4096) -> str:
    freed = int(result.get("freed_pages") or 0)
    how = "VACUUM (the whole file rewritten)" if result["mode"] == "full" else "incremental vacuum"
    return f"{how}: {freed:,} pages ({size(freed * page_size)}) handed back in {result['elapsed_s']:.1f} s\n"


def format_check(result: JsonDict) -> str:
    if result["ok"]:
        return (
            f"ok: {result['tables']} tables and their indexes, foreign keys and the projections "
            f"checked in {result['elapsed_s']:.1f} s\n"
        )
    lines = [f"{len(result['problems'])} problem(s) found:\n"]
    lines += [f"  {p}\n" for p in result["problems"]]
    return "".join(lines)


def format_backup(result: JsonDict) -> str:
    return (
        f"backed up to {result['path']}: {size(result['bytes'])}, the database as of sequence "
        f"{result['sequence']:,}, in {result['elapsed_s']:.1f} s\n"
    )
