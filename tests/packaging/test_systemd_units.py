"""systemd units for Debian / Raspberry Pi OS: the 128 MiB / 64-task budget, sandboxing,
a dedicated user, what `serve` and `pull` need (stop handling, writable paths, the
shipped config), and `systemd-analyze verify` when it is installed."""

from __future__ import annotations

import configparser
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from qinglong_edge.config import load_config, parse_config
from qinglong_edge.errors import ConfigError
from tests.packaging.conftest import PACKAGING, Dist
from tests.packaging.installed import STOP_MARGIN_S, serve_stop_seconds
from tests.test_config import WORKER, minimal

UNITS = PACKAGING / "files" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((UNITS / name).read_text())
    return parser


@pytest.mark.parametrize("name", ["qinglong-edge.service", "qinglong-edge-pull.service"])
def test_service_budget_and_sandbox(name: str) -> None:
    service = _unit(name)["Service"]
    assert service["MemoryMax"] == "128M"
    assert service["TasksMax"] == "64"
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service["User"] == service["Group"] == "qinglong"
    assert service["StateDirectory"] == "qinglong-edge"
    assert service["ReadWritePaths"] == "/var/lib/qinglong-edge"
    assert service["ProtectHome"] == "yes"
    assert service.get("PrivateTmp") == "yes" or "/tmp:mode=1777" in service["TemporaryFileSystem"].split()
    assert "AF_INET" in service["RestrictAddressFamilies"]
    assert service["ExecStart"].startswith("/usr/local/bin/qinglong-edge --config /etc/qinglong-edge/config.json ")


def test_serve_and_pull_commands() -> None:
    serve = _unit("qinglong-edge.service")
    assert serve["Service"]["ExecStart"].endswith(" serve")
    assert serve["Service"]["Type"] == "simple" and serve["Install"]["WantedBy"] == "multi-user.target"
    assert serve["Service"]["Delegate"] == "yes"  # per-Run cgroups below the service
    assert "78" in serve["Service"]["RestartPreventExitStatus"].split()
    pull = _unit("qinglong-edge-pull.service")
    assert pull["Service"]["ExecStart"].endswith(" pull") and pull["Service"]["Type"] == "oneshot"
    timer = _unit("qinglong-edge-pull.timer")
    # Second 0 of every minute, precisely and unrandomized: the agent's stable phase
    # (worker.splayMaxMs) is measured from it.
    assert timer["Timer"]["OnCalendar"] == "*-*-* *:*:00"
    assert (timer["Timer"]["AccuracySec"], timer["Timer"]["RandomizedDelaySec"]) == ("1s", "0")
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_pull_keeps_its_runtime_directory_in_ram_between_runs() -> None:
    """Spec README, storage on flash: /run/qinglong-edge (the config's default
    worker.runtimeDirectory) survives between timer runs; serve does not own it (its
    stop would remove it)."""
    from qinglong_edge.config import DEFAULT_RUNTIME_DIRECTORY

    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert "/run/" + pull["RuntimeDirectory"] == DEFAULT_RUNTIME_DIRECTORY
    assert (pull["RuntimeDirectoryMode"], pull["RuntimeDirectoryPreserve"]) == ("0700", "yes")
    assert "RuntimeDirectory" not in _unit("qinglong-edge.service")["Service"]


def test_only_the_unit_that_runs_remote_jobs_allows_their_namespaces() -> None:
    """Remote jobs get a private user + mount + PID namespace (spec README, "Isolation";
    issue 24): the pull unit allows exactly those three types; serve (Local Runs: no
    isolation) allows none."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert sorted(pull["RestrictNamespaces"].split()) == ["mnt", "pid", "user"]
    assert _unit("qinglong-edge.service")["Service"]["RestrictNamespaces"] == "yes"


def test_the_pull_unit_puts_no_locked_mount_over_proc() -> None:
    """A remote job's private /proc is refused by the kernel when a locked mount covers part
    of the /proc it came from: ProtectKernelTunables= (/proc/sys...) and ProtectKernelLogs=
    (/proc/kmsg) make such mounts (tests/process/test_isolation.py reproduces both: the
    probe then reports "PID namespace" without a private /proc). serve keeps them."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert "ProtectKernelTunables" not in pull and "ProtectKernelLogs" not in pull
    serve = _unit("qinglong-edge.service")["Service"]
    assert (serve["ProtectKernelTunables"], serve["ProtectKernelLogs"]) == ("yes", "yes")


def test_both_units_start_the_agent_in_a_leaf_so_jobs_get_memory_leaves() -> None:
    """cgroup v2 enables controllers only in a cgroup without processes: systemd starts the
    agent in agent/ of its unit's cgroup (DelegateSubgroup=), so the agent may enable the
    memory controller for its jobs' leaves (process/cgroup_memory.py)."""
    for name in ("qinglong-edge-pull.service", "qinglong-edge.service"):
        assert _unit(name)["Service"]["DelegateSubgroup"] == "agent", name


def test_serve_stop_leaves_the_runs_to_the_controller() -> None:
    """KillMode=mixed: SIGTERM reaches serve only, whose controller stops the Runs and records
    them cancelled (reason shutdown); control-group mode would SIGTERM them behind its back."""
    service = _unit("qinglong-edge.service")["Service"]
    assert service["KillMode"] == "mixed"
    assert "SendSIGKILL" not in service  # what is left after the timeout still gets SIGKILL


# ---- a resident pull (spec README, "Units") --------------------------------------------------------------

def test_a_resident_pull_is_never_timed_out_mid_job() -> None:
    """A oneshot stays "activating" while ExecStart runs: the whole life of a resident pull.
    Its start timeout is off by default; the unit says so explicitly (the old 5min would
    have stopped the pull five minutes into a job). No RemainAfterExit: the unit must go
    inactive when the pull exits, or the timer would never start it again."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert pull["Type"] == "oneshot"
    assert pull["TimeoutStartSec"] == "infinity"
    assert "TimeoutSec" not in pull and "RuntimeMaxSec" not in pull
    assert pull.get("RemainAfterExit", "no") == "no"
    assert "Restart" not in pull  # the timer starts it; a restart loop would fight it


def test_a_stopped_or_crashed_pull_leaves_its_jobs_running() -> None:
    """KillMode=process: SIGTERM (and, after TimeoutStopSec, SIGKILL) reach the pull alone,
    at `systemctl stop` and whenever a oneshot's ExecStart ends (systemd then stops the
    unit); the default control-group mode would kill every remote job with it. The stop
    timeout covers the call in flight (worker.requestTimeoutMs, at most 60 s)."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert pull["KillMode"] == "process"
    assert "SendSIGKILL" not in pull and "ExecStop" not in pull
    document = minimal(worker={**WORKER, "requestTimeoutMs": 60_000})
    assert parse_config(document).worker is not None
    with pytest.raises(ConfigError):
        parse_config(minimal(worker={**WORKER, "requestTimeoutMs": 60_001}))
    assert _seconds(pull["TimeoutStopSec"]) >= 60 + STOP_MARGIN_S


def test_remote_jobs_get_their_own_cgroup_below_the_pull_unit() -> None:
    """The agent's CgroupManager creates qinglong-edge/<attemptId> in its *own* cgroup
    (process/cgroups.py: the agent's cgroup first, then the hierarchy root, which a
    service user cannot write): that needs the unit's subtree delegated to User= and
    /sys/fs/cgroup writable in the unit's namespace. ProtectKernelTunables= leaves
    /sys/fs/cgroup writable (systemd's namespace.c: READWRITE_IMPLICIT there; only
    ProtectControlGroups= makes it read-only)."""
    for name in ("qinglong-edge-pull.service", "qinglong-edge.service"):
        service = _unit(name)["Service"]
        assert service["Delegate"] == "yes", name
        assert service.get("ProtectControlGroups", "no") == "no", name
        assert "/sys" not in service.get("ReadOnlyPaths", "") + service.get("InaccessiblePaths", ""), name


def test_a_job_that_outlives_its_pull_keeps_its_tmp() -> None:
    """systemd removes a PrivateTmp= directory at every stop of the unit (service.c
    service_enter_dead: "We want fresh tmpdirs"), which for a oneshot is every end of the
    pull: a job left running by a stopped or crashed pull would lose its files under it.
    A TemporaryFileSystem= mount lives as long as the last process using it. serve's Runs
    never outlive serve, so it keeps PrivateTmp=."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert pull.get("PrivateTmp", "no") == "no"
    assert sorted(pull["TemporaryFileSystem"].split()) == ["/tmp:mode=1777", "/var/tmp:mode=1777"]
    assert _unit("qinglong-edge.service")["Service"]["PrivateTmp"] == "yes"


#: Settings of the units that the jobs inherit (a job runs in the unit's cgroup and
#: namespace, under its seccomp filters and limits): the same in both units, except
#: those named with the reason in DIFFERENCES.
JOB_SANDBOX = (
    "User", "Group", "UMask", "MemoryMax", "TasksMax", "LimitNOFILE", "Delegate", "NoNewPrivileges",
    "ProtectSystem", "ReadWritePaths", "ProtectHome", "PrivateTmp", "TemporaryFileSystem", "PrivateDevices",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
    "ProtectHostname", "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime", "RestrictSUIDSGID",
    "LockPersonality", "MemoryDenyWriteExecute", "SystemCallArchitectures", "SystemCallFilter", "PrivateNetwork",
    "PrivateUsers", "CapabilityBoundingSet", "AmbientCapabilities", "IPAddressDeny", "DevicePolicy",
)
DIFFERENCES = {
    "RestrictNamespaces": "remote jobs are isolated in a user + mount + PID namespace; Local Runs are not",
    "ProtectKernelTunables": "a locked mount over /proc/sys: a remote job's private /proc would be refused",
    "ProtectKernelLogs": "a locked mount over /proc/kmsg: a remote job's private /proc would be refused",
    "PrivateTmp": "remote jobs outlive a stopped pull; Local Runs never outlive serve",
    "TemporaryFileSystem": "the pull's private /tmp that outlives a stopped pull",
}


def test_jobs_get_the_same_sandbox_under_both_units() -> None:
    serve = _unit("qinglong-edge.service")["Service"]
    pull = _unit("qinglong-edge-pull.service")["Service"]
    differing = {key for key in JOB_SANDBOX if serve.get(key) != pull.get(key)}
    assert differing == set(DIFFERENCES)
    # JIT runtimes (node, the JVM) need writable+executable memory: neither unit forbids it.
    assert "MemoryDenyWriteExecute" not in serve and "MemoryDenyWriteExecute" not in pull
    for name in ("qinglong-edge.service", "qinglong-edge-pull.service"):  # and each unit says why
        text = (UNITS / name).read_text()
        assert "No MemoryDenyWriteExecute=" in text and "JIT" in text, name


def _seconds(value: str) -> float:
    """A systemd time span (``15s``, ``1min 30s``, ``20``) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "ms": 0.001}
    if value == "infinity":
        return float("inf")
    parts = re.findall(r"(\d+)\s*([a-z]*)", value)
    assert parts and "".join(n + u for n, u in parts) == value.replace(" ", ""), value
    return sum(int(number) * units[unit] for number, unit in parts)


def test_stop_timeout_covers_the_drain_and_the_controller_stop() -> None:
    service = _unit("qinglong-edge.service")["Service"]
    config = load_config(str(UNITS / "config.json"))
    assert config.execution is not None  # the controller's stop counts
    assert _seconds(service["TimeoutStopSec"]) >= serve_stop_seconds(config) + STOP_MARGIN_S


def test_seconds_parser() -> None:
    assert [_seconds(v) for v in ("15s", "1min 30s", "20", "500ms")] == [15, 90, 20, 0.5]


def _writable(service: configparser.SectionProxy) -> list[str]:
    paths = service["ReadWritePaths"].split()
    paths += [f"/var/lib/{name}" for name in service.get("StateDirectory", "").split()]
    return paths


def _below(path: str, roots: list[str]) -> bool:
    return any(os.path.normpath(path) == root or os.path.normpath(path).startswith(root + "/") for root in roots)


def test_shipped_config_lets_serve_start_and_write_only_where_the_unit_allows() -> None:
    """serve needs localApi (else exit 78) and writes the database (and its journal files
    beside it), the pepper keyring (admin init), the Run logs and the Runs' work directory
    (execution.workDirectory); ProtectSystem=strict makes everything else read-only."""
    config = load_config(str(UNITS / "config.json"))
    assert config.local_api is not None and config.execution is not None
    serve = _unit("qinglong-edge.service")["Service"]
    for path in (config.state_directory, os.path.dirname(config.local_api.database_file),
                 config.local_api.pepper_keyring_directory, config.execution.log_directory,
                 config.execution.work_directory):
        assert _below(path, _writable(serve)), path
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert _below(config.state_directory, _writable(pull))  # the journal defaults to <state>/worker
    assert not _below("/etc/qinglong-edge", _writable(serve) + _writable(pull))  # credentials stay read-only


def test_dist_ships_the_units_unchanged(dist: Dist) -> None:
    for name in ("qinglong-edge.service", "qinglong-edge-pull.service", "qinglong-edge-pull.timer"):
        assert (dist.directory / name).read_bytes() == (UNITS / name).read_bytes()


def test_systemd_analyze_verify_is_clean(tmp_path: pathlib.Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    launcher = tmp_path / "bin" / "qinglong-edge"
    launcher.parent.mkdir()
    launcher.write_text("#!/bin/sh\nexit 0\n")
    launcher.chmod(0o755)
    names = ["qinglong-edge.service", "qinglong-edge-pull.service", "qinglong-edge-pull.timer"]
    for name in names:
        text = (UNITS / name).read_text().replace("/usr/local/bin/qinglong-edge", str(launcher))
        (tmp_path / name).write_text(text)
    proc = subprocess.run([analyze, "verify", *(f"./{n}" for n in names)], capture_output=True, text=True,
                          cwd=tmp_path, check=False, timeout=120)
    if "Failed to" in proc.stderr and "bus" in proc.stderr.lower():
        pytest.skip(f"systemd-analyze cannot run here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    if _systemd_version(analyze) < 254:
        # DelegateSubgroup= (the agent's leaf, for its jobs' memory leaves) is systemd 254's:
        # older versions warn and ignore it, and doctor's `memory` check says what that costs.
        warnings = [w for w in warnings if "Unknown key 'DelegateSubgroup'" not in w]
    assert warnings == [], proc.stderr  # warnings (unknown keys, bad values) are failures too


def _systemd_version(analyze: str) -> int:
    first = subprocess.run([analyze, "--version"], capture_output=True, text=True, check=False).stdout.split()
    return int(first[1]) if len(first) > 1 and first[1].isdigit() else 0


def test_verify_catches_a_bad_unit(tmp_path: pathlib.Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nMemoryMax=lots\n")
    proc = subprocess.run([analyze, "verify", "./bad.service"], capture_output=True, text=True, cwd=tmp_path,
                          check=False, timeout=120)
    assert "MemoryMax" in proc.stderr or "memory" in proc.stderr.lower()


def test_the_journal_gets_each_failure_of_a_pull_not_every_minutes_line() -> None:
    """Issue 23 item 5: stderr (each failure once per distinct failure per hour with its
    remedy, the warnings) goes to the journal; stdout (every minute's result line) nowhere,
    so an idle pull writes nothing to a persistent journal."""
    pull = _unit("qinglong-edge-pull.service")["Service"]
    assert (pull["StandardOutput"], pull["StandardError"]) == ("null", "journal")
    assert pull["SyslogIdentifier"] == "qinglong-edge-pull"
