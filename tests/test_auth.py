"""The token file's life cycle and the pure request checks in t3d.api.auth."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from t3d.api.auth import (
    bearer_ok,
    exposure_warning,
    host_allowed,
    load_or_create_token,
    origin_allowed,
)
from t3d.errors import ConfigError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_token_is_created_private_and_then_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    token, path = load_or_create_token(state)

    assert path == state / "auth" / "token"
    assert len(token) >= 40
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temp file left
    assert load_or_create_token(state) == (token, path)


def test_each_state_dir_gets_its_own_token(tmp_path: Path) -> None:
    first, _ = load_or_create_token(tmp_path / "a")
    second, _ = load_or_create_token(tmp_path / "b")
    assert first != second


def test_existing_token_is_read_and_stripped(tmp_path: Path) -> None:
    (tmp_path / "auth").mkdir(mode=0o700)
    (tmp_path / "auth" / "token").write_text("  abc-123\n")
    (tmp_path / "auth" / "token").chmod(0o600)
    assert load_or_create_token(tmp_path)[0] == "abc-123"


def test_loose_mode_is_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token, path = load_or_create_token(tmp_path)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="t3d.api"):
        assert load_or_create_token(tmp_path)[0] == token
    assert _mode(path) == 0o600
    assert "tightening" in caplog.text


def test_empty_token_file_is_a_config_error_naming_path_and_fix(tmp_path: Path) -> None:
    (tmp_path / "auth").mkdir()
    path = tmp_path / "auth" / "token"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="delete it") as info:
        load_or_create_token(tmp_path)
    assert str(path) in str(info.value)


def test_unreadable_token_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "auth" / "token").mkdir(parents=True)  # a directory cannot be read as text
    with pytest.raises(ConfigError, match="cannot read the auth token"):
        load_or_create_token(tmp_path)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),
        ("BEARER   s3cret  ", True),
        ("Bearer s3cret2", False),
        ("Bearer s3cre", False),
        ("Bearer ", False),
        ("Basic s3cret", False),
        ("s3cret", False),
        ("Bearer sécret", False),  # non-ASCII must not raise
    ],
)
def test_bearer_header_variants(header: str, expected: bool) -> None:
    assert bearer_ok({"authorization": header}, "s3cret") is expected


def test_bearer_missing_header_or_empty_token_is_refused() -> None:
    assert not bearer_ok({}, "s3cret")
    assert not bearer_ok({"authorization": "Bearer "}, "")


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        (None, True),
        ("http://127.0.0.1:3774", True),
        ("http://localhost:3774", True),
        ("http://LOCALHOST:3774", True),
        ("http://[::1]:3774", True),
        ("https://127.0.0.1:3774", True),
        ("http://10.0.0.5:3774", True),  # the bound host itself
        ("https://10.0.0.5:3774", True),
        ("http://127.0.0.1:3775", False),  # another port
        ("http://127.0.0.1", False),  # default port 80
        ("http://evil.example:3774", False),
        ("http://localhost.evil.example:3774", False),
        ("ws://127.0.0.1:3774", False),
        ("file://127.0.0.1:3774", False),
        ("null", False),
        ("", False),
        ("http://127.0.0.1:3774/path", False),
        ("http://user@127.0.0.1:3774", False),
        ("http://127.0.0.1:99999", False),
        ("http://[::1", False),
    ],
)
def test_origin_matrix(origin: str | None, expected: bool) -> None:
    assert origin_allowed(origin, "10.0.0.5", 3774) is expected


def test_origin_ipv6_bound_host_is_compared_canonically() -> None:
    assert origin_allowed("http://[fd00::1]:80", "fd00:0:0::1", 80)
    assert origin_allowed("http://[fd00::1]", "[fd00::1]", 80)
    assert not origin_allowed("http://[fd00::2]:80", "fd00::1", 80)


@pytest.mark.parametrize("bound", ["0.0.0.0", "::"])
def test_origin_of_an_unspecified_address_is_not_loopback(bound: str) -> None:
    """Bound to every address, ``http://0.0.0.0:PORT`` (or ``[::]``) is a foreign origin,
    while loopback origins stay allowed."""
    assert not origin_allowed("http://0.0.0.0:3774", bound, 3774)
    assert not origin_allowed("http://[::]:3774", bound, 3774)
    assert origin_allowed("http://127.0.0.1:3774", bound, 3774)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (None, True),  # HTTP/1.0 without Host: not a browser
        ("127.0.0.1:3774", True),
        ("127.0.0.1", True),  # no port: the name decides
        ("localhost:3774", True),
        ("LocalHost:3774", True),
        ("[::1]:3774", True),
        ("[0:0::1]:3774", True),
        ("127.0.0.1:3775", False),  # another port
        ("evil.example:3774", False),  # DNS rebinding
        ("localhost.evil.example:3774", False),
        ("10.0.0.9:3774", False),  # not the bound address
        ("::1", False),  # an IPv6 literal must be bracketed
        ("[::1:3774", False),
        ("[::1]x:3774", False),
        ("127.0.0.1:port", False),
        ("127.0.0.1:99999", False),
        ("127.0.0.1:\u00b2", False),  # a digit, but not an ASCII one
        (":3774", False),
        ("", False),
    ],
)
def test_host_matrix_on_loopback(host: str | None, expected: bool) -> None:
    """Host must be a loopback name (or the bound address) with the bound port, if any."""
    assert host_allowed(host, "127.0.0.1", 3774) is expected


def test_host_of_a_specific_bound_address_and_of_a_wildcard_bind() -> None:
    """Bound to one address, that address is accepted besides loopback; bound to every
    address, any IP address is (a rebinding page can only send a DNS name); DNS names other
    than localhost never are."""
    assert host_allowed("10.0.0.5:3774", "10.0.0.5", 3774)
    assert host_allowed("[fd00::1]:3774", "fd00:0::1", 3774)
    assert not host_allowed("10.0.0.6:3774", "10.0.0.5", 3774)
    for bound in ("0.0.0.0", "::"):
        assert host_allowed("192.168.1.20:3774", bound, 3774)
        assert host_allowed("[fd00::7]:3774", bound, 3774)
        assert host_allowed("localhost:3774", bound, 3774)
        assert not host_allowed("myhost.lan:3774", bound, 3774)
        assert not host_allowed("192.168.1.20:80", bound, 3774)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_no_exposure_warning_for_loopback(host: str) -> None:
    """Loopback listen addresses need no warning."""
    assert exposure_warning(host) is None


@pytest.mark.parametrize(
    ("host", "says"), [("0.0.0.0", "every network interface"), ("::", "every network interface"), ("192.168.1.20", "beyond loopback")]
)
def test_exposure_warning_for_addresses_beyond_loopback(host: str, says: str) -> None:
    """A listen address beyond loopback gets a warning that says what is exposed and the fix."""
    warning = exposure_warning(host)
    assert warning is not None
    assert says in warning
    assert host in warning
    assert "--host 127.0.0.1" in warning
