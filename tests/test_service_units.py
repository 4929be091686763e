"""The systemd user units and `t3d service`: one generator for the units (the repository's
systemd/ files are its default output), `systemd-analyze verify` on what it writes, and
`t3d service install|uninstall|status` where systemd is missing, unreachable, or a fake
`systemctl` records what it is asked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from t3d.service.command import describe_unit, installed_commands
from t3d.service.systemctl import parse_show
from t3d.service.units import DEFAULT_SPEC, UNIT_NAMES, UnitSpec, render_units, state_dir_of

REPO = Path(__file__).resolve().parent.parent
T3D = str(Path(sys.executable).parent / "t3d")


def test_the_repository_units_are_the_generators_defaults() -> None:
    """systemd/ holds exactly the three units, byte for byte what `render_units` gives for the
    default spec (~/.local/bin, %S/t3d); the daemon unit is Type=notify with a watchdog, gives
    up on exit status 2 and has start limits."""
    rendered = render_units(DEFAULT_SPEC)
    assert sorted(p.name for p in (REPO / "systemd").iterdir()) == sorted(UNIT_NAMES)
    for name in UNIT_NAMES:
        assert (REPO / "systemd" / name).read_text() == rendered[name], name
    daemon = rendered["t3d.service"]
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=30", "RestartPreventExitStatus=2",
                 "StartLimitIntervalSec=300", "StartLimitBurst=5", "KillMode=mixed",
                 "ExecStart=%h/.local/bin/t3d serve --state-dir %S/t3d"):  # fmt: skip
        assert f"\n{line}\n" in daemon, line
    assert "ListenStream=%S/t3d/spawner.sock" in rendered["t3d-spawner.socket"]


def test_paths_are_escaped_for_systemd_and_read_back() -> None:
    """Real paths with a space, '%' or '$' are quoted and escaped in ExecStart= (they would be
    specifiers or variables otherwise), and `state_dir_of` reads the state dir back."""
    spec = UnitSpec.for_paths(["/opt/my t3d/bin/t3d"], ["/opt/my t3d/bin/t3d-spawner"], "/srv/st 100%/$x", "/etc/t3d.env")
    units = render_units(spec)
    assert 'ExecStart="/opt/my t3d/bin/t3d" serve --state-dir "/srv/st 100%%/$$x"\n' in units["t3d.service"]
    assert "EnvironmentFile=/etc/t3d.env\n" in units["t3d.service"]
    assert "ListenStream=/srv/st 100%%/$$x/spawner.sock" in units["t3d-spawner.socket"]
    assert state_dir_of(units["t3d.service"]) == "/srv/st 100%/$x"
    assert state_dir_of(render_units(DEFAULT_SPEC)["t3d.service"]) == "%S/t3d"


def _verify(units_dir: Path, home: Path, runtime: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "--user", "verify", *(str(units_dir / n) for n in UNIT_NAMES)],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)},
    )  # fmt: skip


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    """`systemd-analyze --user verify` finds nothing to say about the units `t3d service install`
    writes (this installation's paths, a state dir with a space) nor about the repository's
    (with ~/.local/bin linked to this installation); a unit with a misspelt key is reported,
    so the check can fail."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    home, runtime = tmp_path / "home", tmp_path / "run"
    (home / ".local" / "bin").mkdir(parents=True)
    runtime.mkdir(mode=0o700)
    daemon, spawner = installed_commands()
    for name, command in (("t3d", daemon), ("t3d-spawner", spawner)):
        if len(command) == 1:
            (home / ".local" / "bin" / name).symlink_to(command[0])
    cases = {
        "installed": render_units(UnitSpec.for_paths(daemon, spawner, str(tmp_path / "state dir"))),
        "repository": {name: (REPO / "systemd" / name).read_text() for name in UNIT_NAMES},
        "misspelt": {**render_units(UnitSpec.for_paths(daemon, spawner, str(tmp_path / "s"))),},
    }
    cases["misspelt"]["t3d.service"] = cases["misspelt"]["t3d.service"].replace("WatchdogSec=", "WatchdogSecs=")
    if len(daemon) > 1:
        del cases["repository"]  # no entry points to link: the interpreter runs -m t3d
    for case, units in cases.items():
        units_dir = tmp_path / case
        units_dir.mkdir()
        for name, text in units.items():
            (units_dir / name).write_text(text)
        done = _verify(units_dir, home, runtime)
        said = (done.stdout + done.stderr).strip()
        if "Failed to initialize manager" in said or "Failed to lookup RuntimeDirectory" in said:
            pytest.skip(f"systemd-analyze --user cannot run here: {said.splitlines()[0]}")
        if case == "misspelt":
            assert "WatchdogSecs" in said, said
        else:
            assert done.returncode == 0 and said == "", (case, said)


def test_systemctl_show_output_is_read_per_unit() -> None:
    """`systemctl show` blocks are read by unit Id, and a unit becomes one status line."""
    shown = parse_show(
        "Id=t3d.service\nActiveState=active\nSubState=running\nUnitFileState=enabled\nMainPID=42\n"
        "NRestarts=2\nStatusText=serving on http://127.0.0.1:3774; 0 sessions, 0 turns running\n\n"
        "Id=t3d-spawner.socket\nLoadState=not-found\nActiveState=inactive\n"
    )
    assert describe_unit(shown["t3d.service"]) == (
        "t3d.service: active (running), enabled, main pid 42, 2 restarts\n"
        "  serving on http://127.0.0.1:3774; 0 sessions, 0 turns running"
    )
    assert describe_unit(shown["t3d-spawner.socket"]) == "t3d-spawner.socket: not installed"


async def run_service(tmp_path: Path, path: Path, *args: str) -> tuple[int, str, str]:
    """`t3d service ARGS` with PATH=``path`` only, and HOME and XDG_CONFIG_HOME in tmp_path."""
    env = {"PATH": str(path), "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    done = await trio.run_process([T3D, "service", *args], capture_stdout=True, capture_stderr=True, check=False, env=env)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_without_systemd_service_commands_say_so_and_change_nothing(tmp_path: Path) -> None:
    """With no systemctl on PATH, `t3d service install`, `uninstall` (with units present) and
    `status` exit 1 saying systemd is not available and write nothing; `install --dry-run` exits
    0 and prints the units with this installation's absolute paths and the state dir, with a
    note, and writes nothing."""
    empty = tmp_path / "bin"
    empty.mkdir()
    status, out, err = await run_service(tmp_path, empty, "install")
    assert status == 1, (out, err)
    assert "systemd is not available here (no systemctl on PATH)" in err and "nothing was changed" in err
    assert not (tmp_path / "config").exists()
    status, out, err = await run_service(tmp_path, empty, "install", "--dry-run")
    assert status == 0, err
    daemon, _ = installed_commands()
    assert f"ExecStart={daemon[0]}" in out and f"--state-dir {tmp_path / 'state' / 't3d'}" in out
    assert "note: systemd is not available here" in out
    assert not (tmp_path / "config").exists()
    status, out, err = await run_service(tmp_path, empty, "status")
    assert status == 1 and "systemd is not available here" in err
    units = tmp_path / "config" / "systemd" / "user"
    units.mkdir(parents=True)
    (units / "t3d.service").write_text("[Service]\n")
    status, out, err = await run_service(tmp_path, empty, "uninstall")
    assert status == 1 and "nothing was changed" in err, (out, err)
    assert (units / "t3d.service").read_text() == "[Service]\n"


FAKE_SYSTEMCTL = """#!/bin/sh
printf '%s\\n' "$*" >> "{log}"
case "$*" in
  *show-environment*) {unreachable} ;;
  *is-active*) exit 3 ;;
esac
exit 0
"""


def fake_systemctl(tmp_path: Path, *, unreachable: bool = False) -> tuple[Path, Path]:
    """A directory with a `systemctl` that logs its arguments (and fails to reach a user
    manager when ``unreachable``); returns (that directory, the log)."""
    bindir, log = tmp_path / "fakebin", tmp_path / "systemctl.log"
    bindir.mkdir()
    fail = "echo 'Failed to connect to bus: No medium found' >&2; exit 1" if unreachable else "exit 0"
    script = bindir / "systemctl"
    script.write_text(FAKE_SYSTEMCTL.format(log=log, unreachable=fail))
    script.chmod(0o755)
    return bindir, log


async def test_an_unreachable_user_manager_is_named_and_nothing_changes(tmp_path: Path) -> None:
    """When `systemctl --user` cannot reach a user manager, install exits 1 quoting systemctl,
    naming the linger step, and writes nothing."""
    bindir, log = fake_systemctl(tmp_path, unreachable=True)
    status, out, err = await run_service(tmp_path, bindir, "install")
    assert status == 1, (out, err)
    for words in ("cannot reach a systemd user manager", "Failed to connect to bus", "loginctl enable-linger", "nothing was changed"):
        assert words in err, err
    assert not (tmp_path / "config").exists()
    assert log.read_text().splitlines() == ["--user show-environment"]


async def test_install_writes_the_units_and_enables_them_uninstall_reverses_it(tmp_path: Path) -> None:
    """install writes the three units (this installation's paths, the given state dir and
    environment file) into $XDG_CONFIG_HOME/systemd/user, reloads and enables --now the socket
    and the daemon, printing each step; a second install finds them up to date; a missing
    --env-file is refused with status 2; uninstall disables and stops all three, removes the
    files and reloads."""
    bindir, log = fake_systemctl(tmp_path)
    units = tmp_path / "config" / "systemd" / "user"
    state, env_file = tmp_path / "my state", tmp_path / "t3d.env"
    status, out, err = await run_service(tmp_path, bindir, "install", "--env-file", str(tmp_path / "nope"))
    assert status == 2 and "--env-file" in err and not units.exists()
    env_file.write_text("T3D_PORT=3999\n")
    status, out, err = await run_service(tmp_path, bindir, "install", "--state-dir", str(state), "--env-file", str(env_file))
    assert status == 0, (out, err)
    daemon, spawner = installed_commands()
    expected = render_units(UnitSpec.for_paths(daemon, spawner, str(state), str(env_file)))
    for name in UNIT_NAMES:
        assert (units / name).read_text() == expected[name], name
        assert f"wrote {units / name}" in out
    assert "$ systemctl --user enable --now t3d-spawner.socket t3d.service" in out
    calls = log.read_text().splitlines()
    assert calls[-2:] == ["--user daemon-reload", "--user enable --now t3d-spawner.socket t3d.service"]
    status, out, err = await run_service(tmp_path, bindir, "install", "--state-dir", str(state), "--env-file", str(env_file))
    assert status == 0 and f"{units / 't3d.service'} is up to date" in out, (out, err)
    status, out, err = await run_service(tmp_path, bindir, "uninstall")
    assert status == 0, (out, err)
    assert "stops every agent" in out
    assert not any((units / name).exists() for name in UNIT_NAMES)
    assert log.read_text().splitlines()[-2:] == [
        "--user disable --now t3d.service t3d-spawner.socket t3d-spawner.service",
        "--user daemon-reload",
    ]
