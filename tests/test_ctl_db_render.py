"""What `t3d ctl db` prints, from the daemon's results (pure functions)."""

from __future__ import annotations

from t3d.ctl.db_render import format_check, format_prune, format_stats, progress_line, size, table


def test_sizes_take_the_largest_unit_that_keeps_one_or_more() -> None:
    assert [size(n) for n in (512, 4096, 3.5 * 2**20, 1.6 * 2**30, 5000 * 2**30)] == [
        "512 B", "4.0 KiB", "3.5 MiB", "1.6 GiB", "5,000.0 GiB",
    ]  # fmt: skip


def test_progress_is_a_bar_when_the_total_is_known_else_a_spinner() -> None:
    """A job that knows its total draws a bar of 30 with its share and phase; one that
    cannot tell (a full VACUUM) a spinner that turns with each poll; both say the time."""
    running = {"done": 45, "total": 100, "phase": "item snapshots", "elapsed_s": 12.34}
    assert progress_line(running, 0) == "[#############-----------------]  45%  item snapshots  12.3 s"
    assert progress_line({**running, "done": 150}, 0).startswith("[" + "#" * 30 + "] 100%")
    vacuum = {"done": 0, "total": 0, "phase": "rewriting the whole file (VACUUM)", "elapsed_s": 3.0}
    assert [progress_line(vacuum, t)[0] for t in range(5)] == ["|", "/", "-", "\\", "|"]


def test_tables_put_numbers_right_and_text_left() -> None:
    text = table(("kind", "total"), [("item.updated", 1234567), ("turn.updated", 5)])
    assert text.splitlines() == ["kind              total", "item.updated  1,234,567", "turn.updated          5"]


def test_stats_prune_and_check_read_as_sentences_and_tables() -> None:
    stats = {
        "path": "/s/t3d.sqlite", "file_bytes": 3 * 2**20, "wal_bytes": 0, "page_size": 4096, "pages": 768,
        "free_pages": 256, "auto_vacuum": "incremental", "sequence": 900, "events": 400,
        "threads": 2, "turns": 3, "items": 40,
        "events_by_kind": {"item.updated": {"total": 400, "by_age": {"<1h": 10, "1h-1d": 20, "1d-7d": 30, "7d-30d": 40, ">30d": 300}}},
        "largest_threads": [{"thread_id": "t1", "title": "a thread", "turns": 3, "items": 40, "events": 399}],
        "retention": {"cursors": {"item": 800, "state": 500}, "shell_pruned_through": 0, "compacted": 310, "threads_to_purge": 1},
    }  # fmt: skip
    text = format_stats(stats)
    assert text.startswith("database /s/t3d.sqlite: 3.0 MiB (WAL 0 B), 768 pages of 4.0 KiB, 256 free (1.0 MiB), auto-vacuum incremental\n")
    assert "item.updated    400   10     20     30      40   300" in text
    assert "t1         40      3     399  a thread" in text
    assert text.endswith(
        "retention: pruned and compacted up to sequence item 800, state 500; 310 compacted event(s) "
        "(their body is their row); 1 deleted thread(s) to purge\n"
    )
    report = {
        "dry_run": True, "elapsed_s": 1.25, "steps": 12, "free_pages": 0,
        "rows": {"item snapshots": 1500, "thread-state events": 20, "deleted threads": 0, "outbox": 3},
        "bytes": {"item snapshots": 3 * 2**20, "thread-state events": 2048},
        "compacted": {"item snapshots": 300, "thread-state events": 10},
        "compacted_bytes": {"item snapshots": 2**20, "thread-state events": 4096},
        "packed": 900, "packed_bytes": 3 * 2**19,
    }  # fmt: skip
    assert format_prune(report) == (
        "would delete: 1,500 item snapshots (3.0 MiB), 20 thread-state events (2.0 KiB), "
        "0 deleted threads (0 B), 3 done outbox rows; would compact 300 item snapshots (1.0 MiB), "
        "10 thread-state events (4.0 KiB); would pack 900 item rows (1.5 MiB smaller); in 1.2 s (12 steps)\n"
    )
    assert format_check({"ok": False, "problems": ["items: 2 rows whose thread does not exist"], "tables": 16, "elapsed_s": 1}) == (
        "1 problem(s) found:\n  items: 2 rows whose thread does not exist\n"
    )
