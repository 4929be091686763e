"""Health latency while agent turns run: the short form of ``python -m bench run``.

    python -m bench.health_probe --sessions 20 --seconds 30

Runs the STRESS profile (1 s think time, the benchmark fixture) for ``--seconds`` after a
5 s warm-up on a fresh daemon, and prints the health and loop-lag figures with turns and
daemon memory. The report and CSVs go to a temporary directory (``--out`` keeps them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson

from bench.__main__ import main as bench_main
from bench.report import fmt

SHOWN = (
    "turns_completed", "turn_p50_s", "health_p50_ms", "health_p99_ms", "health_max_ms",
    "loop_lag_p99_ms", "loop_lag_max_ms", "daemon_rss_peak_mib",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--out", help="keep the report here (default: a temporary directory)")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="t3d-health-probe-")
    status = bench_main(
        [
            "run",
            "--profile",
            "stress",
            "--sessions",
            str(args.sessions),
            "--window",
            str(args.seconds),
            "--warmup",
            "5",
            "--out",
            out,
        ]
    )
    (run,) = orjson.loads((Path(out) / "summary.json").read_bytes())["runs"]
    print(
        f"sessions={args.sessions} window={args.seconds:g}s {'valid' if run['valid'] else 'INVALID: ' + '; '.join(run['reasons'])}"
    )
    print("  ".join(f"{name}={fmt(run['figures'].get(name))}" for name in SHOWN))
    print(f"report: {Path(out) / 'report.md'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
