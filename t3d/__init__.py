"""t3d: a local daemon that runs and supervises coding-agent sessions."""

__version__ = "0.2.0"
