"""Device honesty (issue 18 item 4): ``doctor`` and ``pull`` say what this machine is
(architecture, support tier, offer-delivery.md 5.1), ``doctor`` fails the worker role on
an architecture QingLong cannot place work on, and ``pull`` says so in one line once per
boot, then exits 78 quietly.

The machine is faked in a child process: ``os.uname`` is replaced before the real CLI
runs (:data:`FAKE_UNAME`), everything else is the real agent against the cluster double.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import REPO, PullEnv, child_env

#: ``python -c FAKE_UNAME MACHINE ARGS...``: the CLI with ``os.uname().machine == MACHINE``.
#: A machine ending in ``/32`` also makes the interpreter look 32-bit (``sys.maxsize``,
#: the word size the agent reads): a 32-bit user space on a 64-bit kernel.
FAKE_UNAME = """
import os, sys
real = os.uname()
machine = sys.argv[1]
if machine.endswith("/32"):
    machine = machine[:-3]
    sys.maxsize = 2**31 - 1
os.uname = lambda: os.uname_result((real.sysname, real.nodename, real.release, real.version, machine))
from qinglong_edge.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture
def env(tmp_path: pathlib.Path, shared_cluster: ClusterDouble) -> PullEnv:
    shared_cluster.reset(tasks=("shell",))
    return PullEnv(tmp_path, shared_cluster)


def _run(machine: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", FAKE_UNAME, machine, *args], capture_output=True, text=True,
                          cwd=REPO, env=child_env(), timeout=60, check=False)


def _doctor(env: PullEnv, machine: str) -> tuple[int, dict[str, dict[str, object]]]:
    proc = _run(machine, "--config", str(env.config_path), "--json", "doctor")
    data = json.loads(proc.stdout)
    return proc.returncode, {check["name"]: check for check in data["checks"]}


def test_the_fake_uname_reaches_the_agent(env: PullEnv) -> None:
    _, checks = _doctor(env, "aarch64")
    assert checks["architecture"]["detail"] == "aarch64: arm64, support tier tier1"
    assert checks["architecture"]["ok"] is True


@pytest.mark.parametrize("machine", ["mips", "mipsel"])
def test_doctor_fails_the_worker_role_on_mips(env: PullEnv, machine: str) -> None:
    status, checks = _doctor(env, machine)
    assert status == 69
    check = checks["architecture"]
    assert (check["ok"], check["required"]) == (False, True)
    assert f"({machine!r})" in str(check["detail"]) and "mips has none" in str(check["detail"])
    assert "Local run API" in str(check["remedy"])


def test_doctor_on_mips_without_the_worker_role_is_fine(env: PullEnv) -> None:
    document = json.loads(env.config_path.read_text())
    del document["worker"]
    env.config_path.write_text(json.dumps(document))
    proc = _run("mips", "--config", str(env.config_path), "--json", "doctor")
    checks = {check["name"]: check for check in json.loads(proc.stdout)["checks"]}
    assert checks["architecture"]["ok"] is True and checks["architecture"]["required"] is False


def test_doctor_warns_on_a_tier_other_than_tier1(env: PullEnv) -> None:
    status, checks = _doctor(env, "armv7l")
    assert status == 0, checks
    check = checks["architecture"]
    assert (check["ok"], check["required"]) == (False, False)  # a warning
    assert "arm/v7, support tier experimental" in str(check["detail"])
    assert "only tasks whose placement lists experimental" in str(check["detail"])


def test_pull_on_mips_says_it_once_per_boot_then_exits_78_quietly(env: PullEnv) -> None:
    pull = ("--config", str(env.config_path), "pull", "--no-splay")
    first = _run("mipsel", *pull)
    assert first.returncode == 78
    assert first.stdout == ""
    assert first.stderr.count("\n") == 1  # ONE line
    assert first.stderr.startswith("qinglong-edge: unsupported_architecture: ")
    assert "'mipsel'" in first.stderr
    again = _run("mipsel", *pull)
    assert (again.returncode, again.stdout, again.stderr) == (78, "", "")  # quietly
    machine = _run("mipsel", *pull, "--json")  # a machine reader still gets its line
    assert machine.returncode == 78
    assert json.loads(machine.stdout)["code"] == "unsupported_architecture"
    assert env.cluster.exchanges == []  # nothing was ever sent
    assert not env.journal.exists()  # nor the journal made
    # Remembered in the runtime directory, keyed by the boot: a reboot says it again.
    notice = env.runtime / "notice.unsupported-architecture"
    assert notice.read_text().startswith("boot ")
    notice.write_text("boot another-boot\n")
    assert _run("mipsel", *pull).stderr.startswith("qinglong-edge: unsupported_architecture: ")


def test_pull_names_the_architecture_and_explains_no_match_on_a_lower_tier(env: PullEnv) -> None:
    """An arm/v7 worker gets no offers from tasks that require tier1 (the default)."""
    env.cluster.state.candidates.clear()
    env.cluster.add_task("shell")  # default placement: tier1 only
    proc = _run("armv7l", "--config", str(env.config_path), "pull", "--no-splay")
    assert proc.returncode == 0, proc.stderr
    assert "arm/v7, support tier experimental" in proc.stdout  # at registration
    assert "idle (no_match)" in proc.stdout
    assert "only tasks whose placement lists experimental in supportTiers get offers" in proc.stdout
    line = json.loads(_run("armv7l", "--config", str(env.config_path), "--json", "pull", "--no-splay").stdout)
    assert line["device"] == {"machine": "armv7l", "architecture": "arm/v7", "supportTier": "experimental"}


def test_a_32_bit_os_on_a_64_bit_kernel_is_announced_as_32_bit_arm(env: PullEnv) -> None:
    """Review (issue 18 item 4): Raspberry Pi OS 32-bit on a Pi 4/5 runs a 64-bit kernel
    (``uname -m``: aarch64) under a 32-bit user space. doctor and pull must say arm/v7
    (experimental), what its programs are, not arm64/tier1."""
    status, checks = _doctor(env, "aarch64/32")
    assert status == 0  # a warning, not a failure
    check = checks["architecture"]
    assert (check["ok"], check["required"]) == (False, False), check
    assert str(check["detail"]).startswith("aarch64 (32-bit user space): arm/v7, support tier experimental")
    proc = _run("aarch64/32", "--config", str(env.config_path), "--json", "pull", "--no-splay")
    line = json.loads(proc.stdout.splitlines()[0])
    assert line["device"] == {"machine": "aarch64", "architecture": "arm/v7", "supportTier": "experimental"}
    registered = [json.loads(e.body) for e in env.cluster.exchanges_for("register")]
    assert json.loads(registered[-1]["capabilitiesJson"])["architecture"] == "arm/v7"
