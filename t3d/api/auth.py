"""The daemon's bearer token and the checks every API request passes.

Rules:
- The token lives in ``<state>/auth/token``; the file is created mode 0600 in
  a 0700 directory, with its final mode from the first byte (``mkstemp``), and
  appears under its name atomically and without replacing a token another
  process just wrote. A token file with looser permissions is tightened.
- Token comparison is constant-time.
- Only :func:`load_or_create_token` touches the file system; the checks are
  pure.
- A request's ``Host`` must name the daemon as it is bound (a loopback name
  or the bound address; any IP address when bound to all of them), so a
  DNS-rebinding page, which reaches a loopback port under a name of its own,
  is refused. A browser ``Origin`` must be a loopback name or the bound
  address; the unspecified addresses (``0.0.0.0``, ``::``) are neither.
"""

from __future__ import annotations

import functools
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
    return host in _bound_names(bound_host)


# Every request asks, with the few Host values its clients send: the answer is kept for
# the last `CHECKED_HOSTS` (parsing the names cost ~8 µs a request; a hit, under 0.1 µs).
CHECKED_HOSTS = 256


@functools.lru_cache(maxsize=CHECKED_HOSTS)
def host_allowed(host_header: str | None, bound_host: str, bound_port: int) -> bool:
    """True when a request's ``Host`` header names this daemon.

    The name must be a loopback name or the bound address, or, when bound to
    every address (``0.0.0.0``, ``::``), any IP address: a DNS-rebinding page
    can only send a DNS name. A port, if given, must be the bound port. No
    Host header at all (HTTP/1.0) is a non-browser client.
    """
    if host_header is None:
        return True
    authority = _split_authority(host_header.strip())
    if authority is None:
        return False
    name, port = authority
    if port is not None and port != bound_port:
        return False
    host = _normalize_host(name)
    if host in _bound_names(bound_host):
        return True
    return _is_unspecified(bound_host) and _is_ip(host)


def exposure_warning(host: str) -> str | None:
    """What to warn about when listening on ``host``; None for a loopback address."""
    if host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback):
        return None
    where = (
        f"every network interface of this host ({host})"
        if _is_unspecified(host)
        else f"{host}, an address beyond loopback"
    )
    return (
        f"the API is served on {where}: anyone who can reach the port and holds the token "
        "can run agents as this user, and the connection is not encrypted; "
        "use --host 127.0.0.1 (the default) unless you mean it, and keep the token secret"
    )


def _bound_names(bound_host: str) -> set[str]:
    """The host names a request may use for a daemon bound to ``bound_host``."""
    names = set(_LOOPBACK_HOSTS)
    if not _is_unspecified(bound_host):
        names.add(_normalize_host(bound_host))
    return names


def _split_authority(authority: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6]:port`` as (name, port); None when malformed."""
    if authority.startswith("["):
        name, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:]
    elif authority.count(":") > 1:
        return None  # an IPv6 literal must be bracketed
    else:
        name, _, port_text = authority.partition(":")
    if not name:
        return None
    if not port_text:
        return name, None
    if (
        not (port_text.isascii() and port_text.isdigit())
        or len(port_text) > 5
        or int(port_text) > 65535
    ):
        return None
    return name, int(port_text)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _is_unspecified(host: str) -> bool:
    return _is_ip(host) and ipaddress.ip_address(host.strip("[]")).is_unspecified


def _normalize_host(host: str) -> str:
    """Lower-case a host name; write an IP literal in its canonical form."""
    bare = host.strip("[]").lower()
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare
