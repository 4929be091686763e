"""The daemon's bearer token and the checks every API request passes.

Rules:
- The token lives in ``<state>/auth/token``; the file is created mode 0600 in
  a 0700 directory, with its final mode from the first byte (``mkstemp``), and
  appears under its name atomically and without replacing a token another
  process just wrote. A token file with looser permissions is tightened.
- Token comparison is constant-time.
- Only :func:`load_or_create_token` touches the file system; the checks are
  pure.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from t3d.errors import ConfigError

logger = logging.getLogger("t3d.api")

_TOKEN_MODE = 0o600
_DIR_MODE = 0o700
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def load_or_create_token(state_dir: Path) -> tuple[str, Path]:
    """Return the token in ``<state_dir>/auth/token`` and its path, creating it if missing.

    Raises ConfigError when the file exists but cannot be read or is empty.
    """
    auth_dir = state_dir / "auth"
    path = auth_dir / "token"
    try:
        state_dir.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        auth_dir.mkdir(mode=_DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the auth directory {auth_dir}: {exc.strerror}; "
            "make the state directory writable or choose another with --state-dir"
        ) from exc
    if not path.exists():
        _create_token_file(path)
    return _read_token_file(path), path


def _create_token_file(path: Path) -> None:
    """Write a fresh token under ``path`` unless some other process got there first."""
    try:
        fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=".token-")
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="ascii") as temp:
            temp.write(secrets.token_urlsafe(32) + "\n")
            temp.flush()
            os.fsync(temp.fileno())
        # link() never replaces: if two starts race, both end up with the same token.
        os.link(temp_name, path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    finally:
        os.unlink(temp_name)


def _unwritable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        f"cannot create the auth token {path}: {exc.strerror}; "
        "make its directory writable or choose another state directory"
    )


def _read_token_file(path: Path) -> str:
    """Read the token, tightening the file's mode to 0600 first if it is looser."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & ~_TOKEN_MODE:
            logger.warning(
                "auth token %s had mode %03o; tightening it to %03o", path, mode, _TOKEN_MODE
            )
            path.chmod(_TOKEN_MODE)
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the auth token {path}: {exc}; "
            "fix its permissions or delete it so a new token is created"
        ) from exc
    if not token:
        raise ConfigError(
            f"the auth token file {path} is empty; delete it so a new token is created"
        )
    return token


def bearer_ok(headers: Mapping[str, str], token: str) -> bool:
    """True when ``Authorization: Bearer <token>`` carries exactly ``token``.

    ``headers`` has lower-case names. The scheme is case-insensitive.
    """
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


def origin_allowed(origin: str | None, bound_host: str, bound_port: int) -> bool:
    """True when a request with this ``Origin`` header may use the API.

    No Origin means a non-browser client. A browser origin must be http or
    https on a loopback name or the bound host, at the bound port; anything
    else, ``null`` included, is foreign.
    """
    if origin is None:
        return True
    try:
        parts = urlsplit(origin)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or port != bound_port:
        return False
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return False
    host = _normalize_host(parts.hostname or "")
    return host in {*_LOOPBACK_HOSTS, _normalize_host(bound_host)}


def _normalize_host(host: str) -> str:
    """Lower-case a host name; write an IP literal in its canonical form."""
    bare = host.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare
