"""`t3d ctl`: the admin and terminal client, over the daemon's public API only.

``client`` connects (HTTP and JSON-RPC over WebSocket), ``render`` turns
entities into terminal text (pure), ``terminal`` writes and reads the terminal,
``main`` parses the subcommands and runs them; each command module (``admin``:
status, threads, stop, memory; ``turn``: run; ``db``: the database) registers its own.
"""

from t3d.ctl.main import add_ctl_arguments, run_ctl

__all__ = ["add_ctl_arguments", "run_ctl"]
