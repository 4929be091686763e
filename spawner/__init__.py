"""t3d-spawner: the sidecar that starts every process for the daemon (standard library only)."""
