"""doctor runs real probes and names what fails, with a remedy."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator

import pytest

from tests.support.cli import REPO, run_cli
from tests.support.ownership import foreign_directory


def _config(tmp_path: pathlib.Path, state: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(state),
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
    }))
    return path


def _checks(result_json: dict[str, object]) -> dict[str, dict[str, object]]:
    checks = result_json["checks"]
    assert isinstance(checks, list)
    return {c["name"]: c for c in checks}


def test_healthy_directory_passes(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "pepper").mkdir(mode=0o700)
    result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
    assert result.status == 0, result.stdout + result.stderr
    assert "doctor: all required checks passed" in result.stdout
    for name in ("hard_links", "o_excl", "fsync", "flock", "sqlite_write", "state_dir", "clock"):
        assert any(line.startswith("ok") and f" {name} " in line for line in result.stdout.splitlines()), name


def test_world_writable_state_directory_fails(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    (state / "pepper").mkdir(mode=0o700)
    result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
    assert result.status == 69
    line = next(ln for ln in result.stdout.splitlines() if " state_dir " in ln)
    assert line.startswith("FAIL")
    assert "mode 0777 allows group/other" in line
    assert "chmod 0700" in line
    data = run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json()
    assert data["ok"] is False
    assert _checks(data)["state_dir"]["ok"] is False


def test_remedies_quote_paths_with_spaces(tmp_path: pathlib.Path) -> None:
    # The remedy is a command to copy and paste: a path with a space must stay one argument.
    state = tmp_path / "my state"
    missing = _checks(run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json())
    assert str(missing["state_dir"]["remedy"]).startswith(f"mkdir -p -m 0700 '{state}'")
    state.mkdir()
    state.chmod(0o755)
    loose = _checks(run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json())
    assert loose["state_dir"]["remedy"] == f"chown {os.geteuid()} '{state}' && chmod 0700 '{state}'"


@contextlib.contextmanager
def _exfat_mount(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    if not (shutil.which("mkfs.exfat") and shutil.which("mount.exfat-fuse") and shutil.which("losetup")):
        pytest.skip("exfatprogs/exfat-fuse not installed (.ci/run installs them)")
    image = tmp_path / "exfat.img"
    with image.open("wb") as handle:
        handle.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.exfat", str(image)], check=True, capture_output=True)
    loop = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=False)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    device = loop.stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        mounted = subprocess.run(["mount.exfat-fuse", device, str(mnt)], capture_output=True, text=True, check=False)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount exFAT via FUSE: {mounted.stderr.strip()}")
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def test_filesystem_without_hard_links_fails(tmp_path: pathlib.Path) -> None:
    with _exfat_mount(tmp_path) as mnt:
        state = mnt / "state"
        state.mkdir()
        result = run_cli("--config", str(_config(tmp_path, state)), "doctor")
        assert result.status == 69, result.stdout
        lines = {ln.split()[1]: ln for ln in result.stdout.splitlines() if ln[:4] in ("ok  ", "FAIL", "warn")}
        assert lines["hard_links"].startswith("FAIL")
        assert "link() failed" in lines["hard_links"]
        assert "not FAT/exFAT" in lines["hard_links"]
        # exFAT has no Unix permissions either: every file shows 0777.
        assert lines["state_dir"].startswith("FAIL")
        assert "0777" in lines["state_dir"]


def test_missing_directories_name_the_command_that_makes_them(tmp_path: pathlib.Path) -> None:
    # Before `admin init` nothing exists: every remedy must be something to run.
    data = run_cli("--config", str(_config(tmp_path, tmp_path / "state")), "doctor", "--json").json()
    checks = _checks(data)
    assert "qinglong-edge admin init" in str(checks["pepper_dir"]["remedy"])
    for name in ("state_dir", "sqlite_write"):
        remedy = str(checks[name]["remedy"])
        assert f"mkdir -p -m 0700 {tmp_path / 'state'}" in remedy
        assert "qinglong-edge admin init" in remedy
    assert not any("the command that creates it" in str(c["remedy"]) for c in checks.values())


# -- one source of truth for file checks (issue 18 item 5) ------------------------------------

@pytest.mark.parametrize("content", ["Bearer {token}\n", "{token} trailing\n", "{token}" + "x" * 300])
def test_a_credential_with_the_wrong_content_gets_a_content_remedy_not_chmod(tmp_path: pathlib.Path,
                                                                          content: str) -> None:
    """Regression (issue 27): a credential file of the right mode and owner whose content is
    not one ``ql3w`` token line (a pasted ``Bearer``, a trailing word, 300 bytes) failed with
    the remedy ``chown 0 DIR FILE && chmod 0700 DIR && chmod 0600 FILE``, which changes
    nothing; pull's remedy said ``1 byte - 1 MiB`` where the credential's bound is 256."""
    from tests.support.cluster_double import ClusterDouble
    from tests.support.pull_env import PullEnv

    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster)
        path = pathlib.Path(env.files["credentialFile"])
        token = path.read_text().strip()
        path.write_text(content.format(token=token))
        pulled = env.pull("--json")
        doctor = env.cli("doctor", "--json")
    assert pulled.status == 78 and pulled.last()["code"] == "credentials_unavailable"
    assert "256" in pulled.last()["remedy"], pulled.last()
    assert doctor.status == 69
    check = _checks(json.loads(doctor.stdout))["worker_credential"]
    assert (check["ok"], check["required"]) == (False, True)
    assert "chmod" not in str(check["remedy"]) and "chown" not in str(check["remedy"]), check
    assert "ql3w_<credentialId>_<secret>" in str(check["remedy"]) and str(path) in str(check["remedy"]), check
    for text in (doctor.stdout, pulled.stdout, pulled.stderr):
        assert token.rsplit("_", 1)[-1] not in text


def test_a_credential_directory_at_0755_fails_doctor_exactly_as_it_fails_pull(tmp_path: pathlib.Path) -> None:
    from tests.support.cluster_double import ClusterDouble
    from tests.support.pull_env import PullEnv

    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster)
        private = pathlib.Path(env.files["credentialFile"]).parent
        private.chmod(0o755)
        pulled = env.pull("--json")
        assert pulled.status == 78 and pulled.last()["code"] == "credentials_unavailable"
        doctor = env.cli("doctor", "--json")
    assert doctor.status == 69
    checks = _checks(json.loads(doctor.stdout))
    # Review (issue 18 item 5: one root cause is reported once with the right remedy):
    # the directory is the cause of all three; it used to be three FAIL lines.
    failed = {name for name, check in checks.items() if not check["ok"] and check["required"]}
    assert failed == {"worker_credential"}
    credential = checks["worker_credential"]
    assert str(credential["detail"]).startswith(f"{private}: the directory of the credential file, the private key "
                                                "file and the certificate file: mode 0755 has forbidden group/other")
    # pull reads the certificate first: the same cause in its words
    assert "parent directory mode 0755 has forbidden group/other bits" in pulled.last()["detail"]
    assert credential["remedy"].startswith(f"chmod 0700 {private} "), credential["remedy"]
    assert "chmod 0600" not in str(credential["remedy"])  # the files themselves are fine
    for name in ("worker_private_key", "worker_certificate"):
        assert (checks[name]["ok"], checks[name]["required"]) == (False, False)
        assert checks[name]["detail"] == f"same cause as worker_credential (its directory {private})"
        assert checks[name]["remedy"] == "fix worker_credential first"
    assert checks["worker_tls_handshake"]["detail"] == "not checked: worker_credential failed"
    assert checks["worker_certificate_validity"]["detail"] == "not checked: worker_credential failed"
    text = env.cli("doctor")
    assert [line for line in text.stdout.splitlines() if line.startswith("FAIL")] == [
        line for line in text.stdout.splitlines() if line.startswith("FAIL worker_credential")]
    assert "doctor: 1 required check(s) failed" in text.stdout + text.stderr
    private.chmod(0o700)
    with ClusterDouble() as cluster:
        healthy = _checks(json.loads(env.cli("doctor", "--json").stdout))
    assert all(healthy[name]["ok"] for name in ("worker_credential", "worker_private_key", "worker_certificate",
                                                 "trust_anchor_0"))


def test_a_credential_directory_and_a_file_both_wrong_give_one_remedy_for_both(tmp_path: pathlib.Path) -> None:
    """The directory's remedy also names the files of that directory that would fail
    next (0644 key), so the one remedy is complete."""
    from tests.support.cluster_double import ClusterDouble
    from tests.support.pull_env import PullEnv

    with ClusterDouble() as cluster:
        env = PullEnv(tmp_path, cluster)
        private = pathlib.Path(env.files["credentialFile"]).parent
        key = pathlib.Path(env.files["privateKeyFile"])
        private.chmod(0o755)
        key.chmod(0o644)
        checks = _checks(json.loads(env.cli("doctor", "--json").stdout))
        failed = {name for name, check in checks.items() if not check["ok"] and check["required"]}
        assert failed == {"worker_credential"}
        assert checks["worker_credential"]["remedy"].startswith(f"chmod 0700 {private} && chmod 0600 {key} ")
        private.chmod(0o700)
        key.chmod(0o600)


def test_a_state_directory_of_another_user_is_one_failure(tmp_path: pathlib.Path) -> None:
    """As root the probes would pass (root ignores modes): the rule still says no."""
    state = foreign_directory(tmp_path / "state")
    checks = _checks(run_cli("--config", str(_config(tmp_path, state)), "doctor", "--json").json())
    failed = [name for name, check in checks.items() if not check["ok"]]
    assert failed == ["state_dir"]
    assert "owned by uid 65534, not 0" in str(checks["state_dir"]["detail"])
    assert str(checks["state_dir"]["remedy"]).startswith(f"chown 0 {state} && chmod 0700 {state}")
    for probe in ("hard_links", "o_excl", "fsync", "flock", "sqlite_write", "sqlite_wal", "pepper_dir"):
        assert probe not in checks


def test_as_the_wrong_user_doctor_reports_one_cause_and_admin_init_exits_73(tmp_path: pathlib.Path) -> None:
    """Issue 18: state owned by another uid made doctor print seven failures with
    unrelated remedies ("put it on ext4"), and admin init exit 74."""
    if os.geteuid() != 0:
        pytest.skip("running as another user needs root")
    from tests.support.cli import unprivileged_python

    python = unprivileged_python()
    top = pathlib.Path(tempfile.mkdtemp(prefix="qle-doctor-"))
    try:
        top.chmod(0o755)
        state = top / "state"
        state.mkdir(mode=0o700)  # root's
        config = _config(top, state)
        config.chmod(0o644)
        environ = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(REPO)}

        def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([python, "-m", "qinglong_edge", "--config", str(config), *args], capture_output=True,
                                  text=True, env=environ, cwd="/", user=65534, group=65534, extra_groups=[],
                                  timeout=60, check=False)

        doctor = as_nobody("doctor")
        assert doctor.returncode == 69, doctor.stdout + doctor.stderr
        failed = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL")]
        assert len(failed) == 1 and " state_dir " in failed[0], doctor.stdout
        assert "owned by uid 0, not 65534" in failed[0] and "chown 65534" in failed[0]
        assert "ext4" not in doctor.stdout
        init = as_nobody("admin", "init")
        assert init.returncode == 73, init.stderr
        assert "unsafe_storage" in init.stderr and "owned by uid 0" in init.stderr
    finally:
        shutil.rmtree(top)


def _worker_config(tmp_path: pathlib.Path, state: pathlib.Path) -> pathlib.Path:
    device = tmp_path / "device"
    device.mkdir(mode=0o700)
    for name in ("credential", "client.pem", "client.key", "ca.pem"):
        (device / name).write_text("x")
        (device / name).chmod(0o600)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(state),
        "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1",
                   "credentialFile": str(device / "credential"), "certificateFile": str(device / "client.pem"),
                   "privateKeyFile": str(device / "client.key"), "trustAnchorFiles": [str(device / "ca.pem")]},
    }))
    return path


def test_isolation_names_what_remote_jobs_cannot_see(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    data = run_cli("--config", str(_worker_config(tmp_path, state)), "doctor", "--json").json()
    check = _checks(data)["isolation"]
    assert check["required"] is False
    if not check["ok"]:
        pytest.skip(f"no job isolation here: {check['detail']}")
    assert "private user+mount namespace" in check["detail"]
    # The agent's private credential directory (it holds the key) and the state directory.
    assert f"{tmp_path / 'device'}, " in check["detail"] and str(state) in check["detail"]
    assert not [p for p in state.iterdir() if p.name.startswith(".isolation-probe-")]  # the probe cleaned up


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is not installed")
def test_without_isolation_doctor_says_plainly_what_a_remote_job_can_read(tmp_path: pathlib.Path) -> None:
    """doctor inside a user namespace whose user.max_user_namespaces is 0: the kernel refuses
    the job's namespace, and doctor warns (not a failure) with what a job can read."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = _worker_config(tmp_path, state)
    import sys

    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -m qinglong_edge --config {config} doctor --json"
    proc = subprocess.run(["unshare", "-U", "-r", "sh", "-c", script], capture_output=True, text=True,
                          timeout=120, check=False, cwd=str(pathlib.Path(__file__).resolve().parent.parent))
    if "unshare failed" in proc.stderr:
        pytest.skip(f"no user namespace for the test itself: {proc.stderr.strip()}")
    check = _checks(json.loads(proc.stdout))["isolation"]
    assert (check["ok"], check["required"]) == (False, False)
    assert "no isolation for remote jobs" in check["detail"] and "can read everything it can" in check["detail"]
    assert str(tmp_path / "device") in check["detail"] and str(state) in check["detail"]
    assert "max_user_namespaces" in check["remedy"]


def _provisioned(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A state directory after a real ``admin init`` (database, keyring, one key)."""
    state = tmp_path / "state"
    config = _config(tmp_path, state)
    assert run_cli("--config", str(config), "admin", "init").status == 0
    return state, config


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_database_serve_refuses_to_recreate_fails_doctor_too(tmp_path: pathlib.Path, how: str) -> None:
    """Review (issue 18 item 5, issue 17 item 5): with keys in the keyring and the database
    gone (or emptied), serve and admin refuse (73 database_missing); doctor said
    ``ok store_database ...: no database yet`` and all required checks passed."""
    state, config = _provisioned(tmp_path)
    database = state / "local.db"
    if how == "removed":
        database.unlink()
    else:
        database.write_bytes(b"")
    result = run_cli("--config", str(config), "--json", "doctor")
    assert result.status == 69, result.stdout
    check = _checks(result.json())["store_database"]
    assert (check["ok"], check["required"]) == (False, True)
    assert "database_missing" in str(check["detail"]) and str(database) in str(check["detail"])
    assert "restore" in str(check["remedy"])
    assert database.exists() == (how == "emptied") and (how == "removed" or database.stat().st_size == 0)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_database_serve_refuses_fails_doctor_too(tmp_path: pathlib.Path, how: str) -> None:
    """Regression (issue 27): a database cut short (flash, a power cut) or overwritten makes
    serve and admin exit 74 ``database_corrupt``; doctor warned ``cannot be read
    (SQLITE_CORRUPT)`` and said "all required checks passed", exit 0."""
    state, config = _provisioned(tmp_path)
    database = state / "local.db"
    data = database.read_bytes()
    database.write_bytes(data[: len(data) // 3] if how == "truncated" else os.urandom(8192))
    assert run_cli("--config", str(config), "admin", "prune").status == 74
    result = run_cli("--config", str(config), "--json", "doctor")
    assert result.status == 69, result.stdout
    check = _checks(result.json())["store_database"]
    assert (check["ok"], check["required"]) == (False, True), check
    assert "database_corrupt" in str(check["detail"]) and str(database) in str(check["detail"])
    assert "restore" in str(check["remedy"])


# -- the pepper keyring as serve checks it (one source of truth) -------------------------------

def _unsafe_key_mode(keyring: pathlib.Path, key: pathlib.Path) -> None:
    key.chmod(0o644)


def _open_keyring(keyring: pathlib.Path, key: pathlib.Path) -> None:
    keyring.chmod(0o755)


def _symlinked_key(keyring: pathlib.Path, key: pathlib.Path) -> None:
    real = keyring.parent / "elsewhere.pepper"
    shutil.move(str(key), real)
    key.symlink_to(real)


def _foreign_key(keyring: pathlib.Path, key: pathlib.Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(key, 65534, 65534)


def _tight_keyring(keyring: pathlib.Path, key: pathlib.Path) -> None:
    keyring.chmod(0o500)  # no group/other bit, so the generic directory rule passed it; serve wants 0700


@pytest.mark.parametrize(("break_it", "words", "remedy"), [
    pytest.param(_unsafe_key_mode, "the pepper key file has mode 0644", "chmod 0600", id="key-0644"),
    pytest.param(_open_keyring, "the pepper keyring directory has mode 0755", "chmod 0700", id="dir-0755"),
    pytest.param(_tight_keyring, "the pepper keyring directory has mode 0500", "chmod 0700", id="dir-0500"),
    pytest.param(_symlinked_key, "not a regular file", "replace", id="key-symlink"),
    pytest.param(_foreign_key, "owner uid 65534", "chown", id="key-foreign-owner"),
])
def test_doctor_fails_a_keyring_that_serve_refuses_with_serves_words(
        tmp_path: pathlib.Path, break_it: Callable[[pathlib.Path, pathlib.Path], None], words: str,
        remedy: str) -> None:
    """serve refuses unsafe key files and keyring modes (exit 73 unsafe_pepper); doctor used
    to judge only the directory, by the generic private-directory rule, and said all was
    well. Now it runs serve's own check: the same line, one failure, a remedy."""
    from qinglong_edge.local.pepper import key_file_name
    from tests.support.serve_site import free_port, provision, write_config
    from tests.support.store import PEPPER_KEY_ID

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    provision(state)
    config = write_config(tmp_path, free_port())
    healthy = _checks(run_cli("--config", str(config), "doctor", "--json").json())["pepper_dir"]
    assert healthy["ok"] is True and "1 key file," in str(healthy["detail"])
    keyring = state / "pepper"
    break_it(keyring, keyring / key_file_name(PEPPER_KEY_ID))
    served = run_cli("--config", str(config), "serve", timeout=30)
    assert served.status == 73 and "unsafe_pepper" in served.stderr
    doctor = run_cli("--config", str(config), "doctor", "--json")
    assert doctor.status == 69
    checks = _checks(json.loads(doctor.stdout))
    assert [name for name, check in checks.items() if not check["ok"] and check["required"]] == ["pepper_dir"]
    pepper = checks["pepper_dir"]
    assert words in str(pepper["detail"])
    assert str(pepper["detail"]) in served.stderr  # serve's very line
    assert remedy in str(pepper["remedy"])
    keyring.chmod(0o700)  # let pytest clean up (0500)


def test_memory_says_whether_jobs_get_a_memory_leaf(tmp_path: pathlib.Path) -> None:
    """Issue 24 item 3: found as the launch finds it (CgroupManager with the configured
    execution.maxRunMemoryBytes); not required either way."""
    from qinglong_edge.process.cgroups import CgroupManager

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    check = _checks(run_cli("--config", str(_worker_config(tmp_path, state)), "doctor", "--json").json())["memory"]
    assert check["required"] is False
    if CgroupManager.detect("auto", memory_max=16 << 20).memory_available:
        assert check["ok"] and "16 MiB, no swap" in check["detail"] and "out_of_memory" in check["detail"]
    else:
        assert not check["ok"] and "no memory limit for jobs" in check["detail"] and "oom_score_adj 1000" in \
            check["detail"]
