"""`t3d ctl`: the admin and terminal client, over the daemon's public API only.

``client`` connects (HTTP and JSON-RPC over WebSocket), ``render`` turns
entities into terminal text (pure), ``commands`` wires them into the
subcommands the CLI calls through :func:`add_ctl_arguments` and :func:`run_ctl`.
"""

from t3d.ctl.commands import add_ctl_arguments, run_ctl

__all__ = ["add_ctl_arguments", "run_ctl"]
