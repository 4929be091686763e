"""Observability: what the daemon tells a person running it (docs/architecture.md, Watching the host).

`histogram.py` and `tally.py` are pure (counts kept on the loop, read at scrape time);
`metrics.py` turns the daemon's in-memory statistics into the Prometheus exposition;
`logs.py` formats log records as text or JSON lines; `agents.py` reads what /proc says
about the agents' processes (blocking: run in a worker thread).
"""
