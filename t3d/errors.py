"""The one error root and its families.

Every error a user can see names what went wrong and what to do about it.
Expected failures are caught by type; anything else propagates to the
supervisor that started the task.
"""

from __future__ import annotations


class T3dError(Exception):
    """Root of every error t3d raises on purpose."""


class ConfigError(T3dError):
    """A setting has a value that is not allowed (start-up stops, exit 2)."""


class StoreError(T3dError):
    """The database refused or lost a statement."""


class WriterClosedError(StoreError):
    """The writer thread is gone; nothing more can be committed."""


class WriterLostError(StoreError):
    """The writer thread died while the daemon ran; the daemon exits with status 1."""


class DatabaseUnavailableError(StoreError):
    """The database cannot take writes for now; the same write can succeed later.

    Client commands fail with it (the API answers JSON-RPC ``UNAVAILABLE``); the daemon's
    own writes (provider output, turn ends, effect bookkeeping) wait and retry instead.
    ``reason`` is a stable machine name for it; ``headline`` says what it is in a few
    words, naming no path or process (what unauthenticated health shows).
    """

    reason = "database_unavailable"
    headline = "the database cannot take writes"


class DatabaseFullError(DatabaseUnavailableError):
    """The disk (or filesystem) holding the database has no room for the write."""

    reason = "database_full"
    headline = "the database is full: free space on the disk of the state dir"


class DatabaseBusyError(DatabaseUnavailableError):
    """Another process holds SQLite's write lock for longer than the busy timeout."""

    reason = "database_busy"
    headline = "the database is locked by another process"


class ServiceError(T3dError):
    """The daemon's lifecycle: another daemon holds the state dir, or systemd cannot be used
    (exit status 1)."""


class ProtocolError(T3dError):
    """A peer sent something the protocol does not allow."""


class ProviderError(T3dError):
    """A provider CLI failed, could not start, or broke its protocol."""


class SpawnerError(T3dError):
    """A process could not be started or supervised."""


class DomainError(T3dError):
    """A command was rejected by the domain rules.

    ``code`` is a stable machine name (``not_found``, ``conflict``,
    ``invalid``) that the API maps onto a JSON-RPC error code; ``full`` (a bound
    reached, e.g. a turn's pending requests) is met by provider writes only.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class GitError(T3dError):
    """A git repository could not be read or written, or a git command failed."""
