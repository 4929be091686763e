"""The daemon's lifecycle as a service: one daemon per state dir (`statedir`), where it
serves (`runfile`, ``daemon.json``), systemd's notify protocol (`notify`), and the user
units with `t3d service` (`units`, `systemctl`, `command`)."""
