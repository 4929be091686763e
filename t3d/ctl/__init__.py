"""`t3d ctl`: the admin and terminal client, over the daemon's public API only.

``client`` connects (HTTP and JSON-RPC over WebSocket), ``shell`` reads the shell
and snapshots and resolves id prefixes; ``render``, ``listing``, ``history`` and
``hints`` are pure (entities to terminal text, tables, turn after turn, the daemon's
hints as ctl commands); ``terminal`` and ``approver`` write, read and ask at the
terminal; ``main`` parses the subcommands and runs them. Each command module registers
its own: ``admin`` (status, stop, memory), ``threads`` (threads, projects), ``turn``
(run), ``follow`` (attach, log), ``lifecycle`` (new, rename, archive, unarchive,
delete, move, revert), ``diff``, ``requests``, ``service`` (shutdown), ``db`` (the database),
``completion``.
"""

from t3d.ctl.main import add_ctl_arguments, run_ctl

__all__ = ["add_ctl_arguments", "run_ctl"]
