"""``serve`` fails closed on an unsafe pepper keyring and on a lost database (issue 17 items
2 and 5): real child processes, real files, real modes and owners, real signals.

* start-up: a key file or the keyring directory with a wrong mode, owner or type is
  exit 73 ``unsafe_pepper`` with ONE line naming the file, its mode and owner;
* while serving: a keyring that becomes unsafe is logged once (requests fail closed,
  503), and once more when it is safe again;
* the database removed or replaced while serving: one line, the store fenced, exit 74
  (restarted by the units); the restart then refuses to create an empty database where
  the keyring proves one existed (exit 73 ``database_missing``), and so do ``admin``
  commands; no path prints a traceback.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import pathlib
import shutil
import signal
import time

import pytest

from qinglong_edge.local.pepper import key_file_name
from tests.support.cli import REPO, run_cli
from tests.support.http_client import exchange, request_bytes
from tests.support.local_site import LocalSite, alive
from tests.support.serve_site import free_port, one_line, start, write_config
from tests.support.store import PEPPER_KEY_ID, TOKEN
from tests.support.wait import wait_until

LIST = "/api/v3/projects/default/runs"


def _key_file(site: pathlib.Path) -> pathlib.Path:
    return site / "state" / "pepper" / key_file_name(PEPPER_KEY_ID)


def _serve_once(site: pathlib.Path) -> tuple[int, str]:
    result = run_cli("--config", str(write_config(site, free_port())), "serve", timeout=30)
    return result.status, result.stderr


def _get(port: int) -> int:
    response = exchange(("127.0.0.1", port), request_bytes("GET", LIST, headers=[("Authorization",
                                                                                   f"Bearer {TOKEN}")]))
    assert response is not None
    return response.status


# -- start-up ------------------------------------------------------------------------------


def test_a_key_file_readable_by_others_refuses_to_start(site: pathlib.Path) -> None:
    key = _key_file(site)
    key.chmod(0o644)
    status, stderr = _serve_once(site)
    assert status == 73
    line = one_line(stderr)
    assert "unsafe_pepper" in line and str(key) in line and "mode 0644" in line, line
    assert f"owner uid {os.geteuid()}" in line and "must be mode 0600" in line


def test_a_keyring_directory_open_to_others_refuses_to_start(site: pathlib.Path) -> None:
    keyring = site / "state" / "pepper"
    keyring.chmod(0o755)
    status, stderr = _serve_once(site)
    assert status == 73
    line = one_line(stderr)
    assert "unsafe_pepper" in line and str(keyring) in line and "mode 0755" in line, line


def test_a_key_file_of_another_owner_refuses_to_start(site: pathlib.Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    key = _key_file(site)
    os.chown(key, 65534, 65534)
    status, stderr = _serve_once(site)
    assert status == 73
    line = one_line(stderr)
    assert str(key) in line and "owner uid 65534" in line and "mode 0600" in line, line


def test_a_key_file_that_is_a_symlink_refuses_to_start(site: pathlib.Path) -> None:
    key = _key_file(site)
    real = site / "elsewhere.pepper"
    shutil.move(str(key), real)
    key.symlink_to(real)
    status, stderr = _serve_once(site)
    assert status == 73
    line = one_line(stderr)
    assert "unsafe_pepper" in line and str(key) in line and "not a regular file" in line


# -- while serving -------------------------------------------------------------------------


def test_a_keyring_that_becomes_unsafe_is_logged_once_and_requests_fail_closed(site: pathlib.Path) -> None:
    port = free_port()
    proc = start(write_config(site, port))
    assert proc.stderr is not None
    seen: list[str] = []

    def lines_with(text: str) -> int:
        return sum(text in line for line in seen)

    def read_until(text: str) -> None:
        def found() -> bool:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if line:
                seen.append(line)
            return lines_with(text) > 0

        wait_until(found, 15, interval=0.05, what=text)

    try:
        assert _get(port) == 200
        key = _key_file(site)
        key.chmod(0o644)
        read_until("became unusable")
        assert _get(port) == 503  # fails closed (authentication_unavailable)
        time.sleep(2.5)  # the scenario: the periodic check's timer runs at least twice more while it stays unsafe
        key.chmod(0o600)
        read_until("safe again")
        assert _get(port) == 200
        assert lines_with("became unusable") == 1 and lines_with("safe again") == 1, seen
        unusable = next(line for line in seen if "became unusable" in line)
        assert str(key) in unusable and "mode 0644" in unusable
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert "Traceback" not in "".join(seen) + rest


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_database_removed_or_replaced_while_serving_exits_74_then_a_restart_refuses(
    site: pathlib.Path, how: str
) -> None:
    port = free_port()
    proc = start(write_config(site, port), "--json")
    database = site / "state" / "local.db"
    try:
        assert _get(port) == 200
        aside = site / "aside.db"
        database.rename(aside)
        if how == "replaced":
            shutil.copyfile(aside, site / "copy.db")
            (site / "copy.db").rename(database)  # another file under the same name
        out, err = proc.communicate(timeout=20)  # exits by itself: no signal sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 74, err
    assert "Traceback" not in err
    lost = [line for line in err.splitlines() if "database_replaced" in line]
    assert len(lost) == 1 and str(database) in lost[0] and f"was {how}" in lost[0], err
    assert '"code": "database_replaced"' in out or '"code":"database_replaced"' in out
    if how == "removed":
        status, stderr = _serve_once(site)
        assert status == 73
        line = one_line(stderr)
        assert "database_missing" in line and str(database) in line and "refusing to create" in line
        assert not database.exists()  # nothing was created
        admin = run_cli("--config", str(write_config(site, free_port())), "admin", "runs", "list",
                        "--project", "default")
        assert admin.status == 73 and "database_missing" in admin.stderr
        assert not database.exists()


def test_the_units_restart_on_the_database_status_and_not_on_what_cannot_heal() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(os.path.join(REPO, "packaging", "files", "systemd", "qinglong-edge.service"))
    prevent = unit["Service"]["RestartPreventExitStatus"].split()
    assert unit["Service"]["Restart"] == "on-failure"
    assert "74" not in prevent and "73" not in prevent  # the restart re-checks; 73 once fixed
    init = pathlib.Path(REPO, "packaging", "files", "openwrt", "qinglong-edge.init").read_text()
    assert "procd_set_param respawn" in init  # procd respawns on any exit status


def test_sigterm_with_jobs_running_after_the_database_was_lost_prints_no_traceback(tmp_path: pathlib.Path) -> None:
    """The reported case: the database moved away while a Run runs; serve stops on its
    own (74) and its controller's drain cannot record anything: one line, no traceback;
    the job is left running for the next start (which reconciles it)."""
    site = LocalSite(tmp_path)
    try:
        site.provision()
        serve = site.serve()
        run_id = site.start_run()
        site.wait_run_status(run_id, "running")
        pid, _ = site.job_pids()
        (site.state / "local.db").rename(tmp_path / "moved.db")
        wait_until(lambda: serve.proc.poll() is not None, 20, interval=0.05, what="serve to exit")
        assert serve.proc.returncode == 74
        stderr = serve.stderr()
        assert "Traceback" not in stderr, stderr
        assert "shutdown drain stopped (store_closed)" in stderr
        assert alive(pid)
    finally:
        with_pid = pathlib.Path(site.pidfile)
        if with_pid.exists():
            job = int(with_pid.read_text().strip() or 0)
            if job and alive(job):  # left running on purpose: its group is led by the job wrapper
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(job), signal.SIGKILL)
        site.close()


def test_sigterm_during_a_normal_drain_prints_no_traceback(site: pathlib.Path) -> None:
    proc = start(write_config(site, free_port()))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "Traceback" not in err


def test_serve_refuses_to_create_a_database_only_when_keys_exist(tmp_path: pathlib.Path) -> None:
    """A fresh state (keyring made, no key yet): serve creates the database as before."""
    state = tmp_path / "state"
    (state / "pepper").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    (state / "pepper").chmod(0o700)
    proc = start(write_config(tmp_path, free_port()))
    try:
        assert (state / "local.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    assert proc.returncode == 0




def test_an_emptied_database_file_is_refused_like_a_missing_one(site: pathlib.Path) -> None:
    """Review (issue 17 item 5): a database file truncated to 0 bytes (``: > local.db``, a
    copy that stopped on a full disk) is, to SQLite, a new empty database. With keys in
    the keyring, serve and admin must refuse it as ``database_missing`` rather than
    migrate an empty schema into it (and then sweep every Run log as an orphan)."""
    database = site / "state" / "local.db"
    logs = site / "state" / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    log = logs / "4d777140-7c2a-4b6e-a19a-a46c92f62a8d_1d4afdcf-0b7e-4a43-9b35-1b8c4d0e9f10.log"
    log.write_bytes(b"step 1\n")
    with open(database, "r+b") as handle:
        handle.truncate(0)
    status, stderr = _serve_once(site)
    assert status == 73, stderr
    line = one_line(stderr)
    assert "database_missing" in line and str(database) in line and "empty" in line
    admin = run_cli("--config", str(write_config(site, free_port())), "admin", "runs", "list", "--project", "default")
    assert admin.status == 73 and "database_missing" in admin.stderr
    assert database.stat().st_size == 0  # nothing was migrated into it
    assert log.read_bytes() == b"step 1\n"  # and no log was swept as an orphan


# -- the pepper keyring gone, the database present ---------------------------------------------

@pytest.mark.parametrize("how", ["moved", "emptied"])
def test_a_lost_keyring_is_refused_with_the_true_remedy_by_serve_admin_init_and_doctor(
        site: pathlib.Path, how: str) -> None:
    """Review: with the keyring moved away (or its key files deleted) and the database
    present, doctor said "run admin init" and admin init then refused (78, after making an
    empty keyring, after which doctor said all was well and serve answered every request
    503). The truth, said by all three: restore the keyring from a backup; without it the
    credentials issued under the lost keys are lost (nothing else), and `admin pepper
    rotate` + new credentials is the way on. serve and admin init refuse with 73
    ``keyring_missing`` and create nothing."""
    keyring = site / "state" / "pepper"
    if how == "moved":
        shutil.move(str(keyring), site / "pepper.moved")
    else:
        for key in keyring.iterdir():
            key.unlink()
    config = write_config(site, free_port())
    status, stderr = _serve_once(site)
    line = one_line(stderr)
    assert status == 73, line
    assert "keyring_missing" in line and str(keyring) in line and "restore" in line, line
    assert "admin pepper rotate" in line and "run 'qinglong-edge admin init'" not in line, line
    init = run_cli("--config", str(config), "admin", "init")
    init_line = one_line(init.stderr)
    assert init.status == 73 and init_line == line, init.stderr
    assert keyring.exists() == (how == "emptied")  # admin init made nothing
    doctor = run_cli("--config", str(config), "--json", "doctor")
    assert doctor.status == 69, doctor.stdout
    checks = {check["name"]: check for check in doctor.json()["checks"]}
    failed = [name for name, check in checks.items() if not check["ok"] and check["required"]]
    assert failed == ["pepper_dir"], failed
    assert "keyring_missing" in str(checks["pepper_dir"]["detail"])
    remedy = str(checks["pepper_dir"]["remedy"])
    assert "restore" in remedy and "backup" in remedy and "admin pepper rotate" in remedy, remedy
    assert "admin init" not in remedy, remedy


def test_without_a_backup_pepper_rotate_is_the_way_on(site: pathlib.Path) -> None:
    """The remedy's second half works: a new active key, then serve starts and admin init
    is content (the old credential no longer authenticates: it is the part lost)."""
    keyring = site / "state" / "pepper"
    shutil.rmtree(keyring)  # no backup: the directory and its key are gone
    config = write_config(site, free_port())
    rotated = run_cli("--config", str(config), "admin", "pepper", "rotate", "--key-id", "edge-pepper-v2")
    assert rotated.status == 0, rotated.stderr
    assert keyring.is_dir() and (keyring.stat().st_mode & 0o777) == 0o700
    assert run_cli("--config", str(config), "admin", "init").status == 0
    doctor = run_cli("--config", str(config), "--json", "doctor")
    checks = {check["name"]: check for check in doctor.json()["checks"]}
    assert checks["pepper_dir"]["ok"] is True, checks["pepper_dir"]
