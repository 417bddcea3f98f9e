"""The OpenWrt service as it really runs: the init script's ``start_service`` (busybox sh,
stub procd) prepares the directories and the rendered config, then the commands procd
and busybox crond would start run as the unprivileged service user.

No ``qinglong`` user exists here, so uid/gid 65534 stands in for it: the stub procd's
``chown qinglong:qinglong DIR`` really chowns DIR to 65534, and ``serve``, ``admin`` and
the crontab's ``pull`` run with ``user=65534``. Everything lives in a directory under
/tmp that the user can traverse (pytest's own tmp_path is root's 0700 tree), with an
interpreter the user can execute (:func:`tests.support.cli.unprivileged_python`).

What this proves against the shipped files: every directory ``serve`` (database,
pepper keyring, Run logs, the Runs' work directory) and ``pull`` (journal) write
exists and belongs to the service user after ``start_service``; procd's stop timeout
covers ``serve``'s drain; the crontab line runs a real pull only while
``worker.enabled`` is 1, ends with its pull although the pull leaves a job running, and
neither holds nor kills that job.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from qinglong_edge.config import load_config
from qinglong_edge.worker.journal.runtime import journal_key
from tests.packaging.conftest import Dist, Unpacked, unpack_ipk
from tests.packaging.installed import STOP_MARGIN_S, Router, serve_stop_seconds, worker_options
from tests.support.cli import Entry, unprivileged_python
from tests.support.cluster_double import ClusterDouble, Fault
from tests.support.jobs import alive
from tests.support.local_site import FAST_EXECUTION, LocalSite, start_and_cancel
from tests.support.openwrt_stubs import read_log
from tests.support.pull_env import PullEnv
from tests.support.wait import wait_until

#: Stands in for the `qinglong` user (uid/gid) the package creates on a router.
SERVICE_UID = 65534
REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, running as another user)")


@pytest.fixture(scope="module")
def unpacked(dist: Dist, busybox: str, tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    return unpack_ipk(busybox, dist.ipk, tmp_path_factory.mktemp("ipk"))


@pytest.fixture
def base() -> Iterator[pathlib.Path]:
    """A fresh 0755 directory under /tmp, traversable by the service user."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="qle-svc-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def _real_chown(router: Router) -> Router:
    # The stub procd only logs chown; here it also really chowns to the stand-in user.
    with open(router.root / "lib/procd.sh", "a") as handle:
        handle.write(f'chown() {{ qle_stub_log "chown $*"; command chown {SERVICE_UID}:{SERVICE_UID} "$2"; }}\n')
    return router


@pytest.fixture
def router(unpacked: Unpacked, base: pathlib.Path, busybox_path: str) -> Router:
    return _real_chown(Router(unpacked, base / "root", busybox_path))


@pytest.fixture
def service_router(unpacked: Unpacked, base: pathlib.Path, busybox_path: str) -> Router:
    """The init script with user nobody:nogroup (uid/gid 65534) and a Python it can run."""
    return _real_chown(Router(unpacked, base / "root", busybox_path, python=unprivileged_python(),
                              user=("nobody", "nogroup")))


def _service_entry(router: Router, python: str) -> Entry:
    """What procd starts (``python3 -u /usr/bin/qinglong-edge ...``), as the service user."""
    return Entry("procd", (python, "-u", str(router.root / "usr/bin/qinglong-edge")),
                 {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}, "/", user=SERVICE_UID)


def _init_admin_entry(router: Router, busybox: str) -> Entry:
    """``/etc/init.d/qinglong-edge admin ARGS`` run by root, as an operator does: it takes
    the argv a LocalSite gives its entry (``--config FILE admin ARGS``) and passes ARGS on
    (the script uses its own rendered config)."""
    return Entry("init.d admin", (busybox, "sh", "-c", router.script('shift 3; admin "$@"'), "sh"), router.env(),
                 "/")


def _owned_private(path: pathlib.Path) -> bool:
    info = path.lstat()
    return stat.S_ISDIR(info.st_mode) and info.st_uid == SERVICE_UID and stat.S_IMODE(info.st_mode) == 0o700


def _chown_tree(top: pathlib.Path) -> None:
    for directory, _, names in os.walk(top):
        os.chown(directory, SERVICE_UID, SERVICE_UID)
        for name in names:
            os.chown(os.path.join(directory, name), SERVICE_UID, SERVICE_UID)


def _syslog_logger(base: pathlib.Path) -> pathlib.Path:
    """A ``logger`` at ``base/bin`` that appends what it reads to ``base/syslog`` (0666, any
    user may write it): what the cron line's ``| logger`` sends is read back from there."""
    logger = base / "bin/logger"
    logger.parent.mkdir()
    logger.write_text(f'#!/bin/sh\ncat >> {base / "syslog"}\n')
    logger.chmod(0o755)
    (base / "syslog").touch(mode=0o666)
    (base / "syslog").chmod(0o666)
    return logger


# ---- procd's stop timeout ------------------------------------------------------------------------------

@pytest.mark.parametrize("edits", [
    pytest.param({}, id="edge_defaults"),
    pytest.param({"main": {"profile": "standalone"}}, id="standalone_drain"),
    pytest.param({"execution": {"enabled": "0"}}, id="no_controller"),
    pytest.param({"execution": {"terminate_grace_ms": "30000", "kill_grace_ms": "2500"}}, id="long_graces"),
    pytest.param({"execution": {"terminate_grace_ms": "1", "kill_grace_ms": "1"}}, id="short_graces"),
])
def test_term_timeout_covers_the_drain_and_the_controller_stop(busybox: str, router: Router,
                                                               edits: dict[str, dict[str, str]]) -> None:
    router.edit_uci({"main": {"enabled": "1"}, "local_api": {"enabled": "1"}, "execution": {"enabled": "1"}})
    router.edit_uci(edits)
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    config = load_config(str(router.rundir / "config.json"))
    assert router.procd_param("term_timeout") == [str(serve_stop_seconds(config) + STOP_MARGIN_S)]


# ---- directories the agent writes ----------------------------------------------------------------------

def test_start_creates_the_agents_directories_outside_the_state_directory(busybox: str, router: Router,
                                                                          base: pathlib.Path) -> None:
    shared = base / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    router.edit_uci({
        "main": {"enabled": "1"},
        "worker": {"enabled": "1", "origin": "https://cluster.example", "worker_id": "edge-1",
                   "journal_directory": str(base / "ram/journal")},
        "local_api": {"enabled": "1", "database_file": str(base / "flash/db/local.db"),
                      "pepper_keyring_directory": str(base / "flash/pepper")},
        "execution": {"enabled": "1", "log_directory": str(shared / "logs"), "work_directory": str(shared / "work")},
    })
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    for directory in (router.state, base / "ram/journal", router.runtime, base / "flash/db", base / "flash/pepper",
                      shared / "logs", shared / "work"):
        assert _owned_private(directory), directory
    # An existing shared directory is never taken over.
    assert shared.stat().st_uid == 0 and stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_a_log_or_work_directory_that_exists_is_never_taken_over(busybox: str, router: Router,
                                                                 base: pathlib.Path) -> None:
    """``log_directory '/tmp'`` (or ``work_directory``): the init script must not chown the
    system's /tmp to the agent and chmod it 0700 (it did, through qle_private_dir)."""
    shared = base / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    router.edit_uci({"main": {"enabled": "1"}, "local_api": {"enabled": "1"},
                     "execution": {"enabled": "1", "log_directory": str(shared), "work_directory": f"{shared}/"}})
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    assert shared.stat().st_uid == 0 and stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_rejects_a_symlink_for_an_agent_directory(busybox: str, router: Router, base: pathlib.Path) -> None:
    (base / "elsewhere").mkdir()
    (base / "keyring").symlink_to(base / "elsewhere")
    router.edit_uci({"main": {"enabled": "1"}, "local_api": {"enabled": "1", "pepper_keyring_directory":
                                                             str(base / "keyring")}})
    result = router.call(busybox, "start_service")
    assert result.returncode != 0
    assert router.procd() == []
    assert (base / "elsewhere").stat().st_uid == 0
    assert any(f"{base / 'keyring'} is not a directory" in line for line in read_log(router.log))


# ---- serve as procd starts it ------------------------------------------------------------------------------

@pytest.mark.slow
def test_serve_runs_as_the_service_user_with_the_shipped_defaults(busybox: str, service_router: Router,
                                                                  base: pathlib.Path) -> None:
    """start_service with the shipped UCI defaults plus the three switches; provisioning
    with `/etc/init.d/qinglong-edge admin ...`; serve (the exact procd command line),
    task.start and a cancel, all as the service user."""
    router = service_router
    site_root = base / "site"
    site_root.mkdir()
    serve_entry = _service_entry(router, unprivileged_python())
    site = LocalSite(site_root, _init_admin_entry(router, busybox))
    os.chown(site_root, SERVICE_UID, SERVICE_UID)  # the job writes its pid files here
    router.edit_uci({"main": {"enabled": "1"}, "local_api": {"enabled": "1", "port": str(site.port)},
                     "execution": {"enabled": "1", **{k: str(v) for k, v in {
                         "terminate_grace_ms": FAST_EXECUTION["terminateGraceMs"],
                         "kill_grace_ms": FAST_EXECUTION["killGraceMs"],
                         "control_interval_ms": FAST_EXECUTION["controlIntervalMs"]}.items()}}})
    result = router.call(busybox, "start_service")
    assert result.returncode == 0, result.stderr
    site.config = router.rundir / "config.json"
    assert router.procd_param("command") == serve_entry.argv("--config", str(site.config), "serve")
    assert router.procd_param("user") == ["nobody"]
    for directory in (router.state, router.logs, router.work):
        assert _owned_private(directory), directory
    try:
        site.provision()  # as root, through the init script, which drops to the service user
        assert (router.state / "local.db").stat().st_uid == SERVICE_UID
        assert _owned_private(router.state / "pepper")
        site.entry = serve_entry
        serve = site.serve()
        # The service user cannot create cgroups: the setsid escapee is not caught here.
        start_and_cancel(site, escapee_dies=False)
        assert serve.stop() == 0, serve.stderr()[-4000:]
    finally:
        site.close()


def test_admin_without_a_rendered_config_says_to_start_first(busybox: str, router: Router) -> None:
    result = router.call(busybox, "admin init")
    assert result.returncode == 78
    assert "start the service first" in result.stderr
    assert not router.state.exists()


# ---- the cron pull ------------------------------------------------------------------------------------------

def _crontab_command(router: Router, python: str) -> str:
    (line,) = [line for line in (router.root / "etc/crontabs/qinglong").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    command = line.split(maxsplit=5)[5]
    for old, new in (("/var/etc/qinglong-edge", str(router.rundir)),
                     ("/usr/bin/qinglong-edge", f"{python} {router.root / 'usr/bin/qinglong-edge'}")):
        assert old in command, old
        command = command.replace(old, new)
    return command


def test_crontab_line_pulls_as_the_service_user_only_while_enabled(busybox: str, service_router: Router,
                                                                   base: pathlib.Path, cluster: ClusterDouble) -> None:
    router = service_router
    python = unprivileged_python()
    applets = base / "busybox-bin"  # busybox_path lives in root's 0700 tmp tree
    applets.mkdir()
    for applet in ("cat", "sh", "test"):
        (applets / applet).symlink_to(busybox)
    device = PullEnv(base / "device", cluster)
    _chown_tree(base / "device")  # the operator's part (docs/packaging.md): the worker's files are the user's
    router.edit_uci(worker_options(device))
    assert router.call(busybox, "start_service").returncode == 0
    assert (router.rundir / "pull.enabled").exists()
    logger = _syslog_logger(base)

    def cron() -> subprocess.CompletedProcess[str]:
        # busybox crond runs the line with /bin/sh -c as the crontab's user.
        return subprocess.run([busybox, "sh", "-c", _crontab_command(router, python)], capture_output=True,
                              text=True, env={"PATH": f"{logger.parent}:{applets}"}, cwd="/",
                              user=SERVICE_UID, group=SERVICE_UID, extra_groups=[], check=False, timeout=60)

    ran = cron()
    assert ran.returncode == 0, ran.stderr
    assert (base / "syslog").read_text() == ""  # pull's stderr goes to the log: nothing went wrong
    inbox = device.inbox()
    assert len(inbox) == 1 and list(inbox) == list(cluster.state.leases_by_offer())
    assert _owned_private(device.journal)
    # The session and owner records went to the RAM runtime directory, not the journal.
    assert sorted(p.name for p in router.runtime.iterdir()) == [journal_key(str(device.journal))]
    assert not (device.journal / "run").exists() and not (device.journal / "session.json").exists()

    seen = len(cluster.exchanges)
    assert router.call(busybox, "stop_service").returncode == 0
    cron()
    assert len(cluster.exchanges) == seen  # worker switched off: the line does nothing
    assert json.loads((router.rundir / "config.json").read_text())["worker"]["workerId"] == cluster.worker_id


def test_the_cron_line_logs_each_failure_once_an_hour_with_its_remedy(busybox: str, service_router: Router,
                                                                      base: pathlib.Path,
                                                                      cluster: ClusterDouble) -> None:
    """Issue 23 item 5: every failure line of pull went to stdout, which the shipped line
    (``2>&1 >/dev/null | logger``) throws away, so logread showed nothing. Now each failure
    reaches the line's logger once per distinct failure per hour, with its remedy."""
    router = service_router
    python = unprivileged_python()
    applets = base / "busybox-bin"
    applets.mkdir()
    for applet in ("cat", "sh", "test"):
        (applets / applet).symlink_to(busybox)
    device = PullEnv(base / "device", cluster)
    _chown_tree(base / "device")
    router.edit_uci(worker_options(device))
    assert router.call(busybox, "start_service").returncode == 0
    logger = _syslog_logger(base)

    def cron() -> int:
        claim = device.claim()
        if claim is not None:
            device.wait_until_due(claim)  # a failed attempt backs off (full jitter from 100 ms)
        return subprocess.run([busybox, "sh", "-c", _crontab_command(router, python)], capture_output=True,
                              text=True, env={"PATH": f"{logger.parent}:{applets}"}, cwd="/", user=SERVICE_UID,
                              group=SERVICE_UID, extra_groups=[], check=False, timeout=60).returncode

    cluster.push_fault(*[Fault.status_answer(500, "internal_error") for _ in range(3)])
    for _ in range(3):
        cron()
    logged = (base / "syslog").read_text().splitlines()
    assert len(logged) == 1, logged  # three failures of one kind: said once
    assert logged[0].startswith("pull: ") and "unavailable (unexpected_status HTTP 500 internal_error)" in logged[0]
    assert " -> the cluster failed handling the call" in logged[0]  # its remedy
    cluster.push_fault(Fault.status_answer(409, "worker_offer_conflict"))
    cron()
    logged = (base / "syslog").read_text().splitlines()
    assert len(logged) == 2 and "HTTP 409 worker_offer_conflict" in logged[1], logged  # a distinct failure
    cron()  # answered (idle): nothing logged
    assert len((base / "syslog").read_text().splitlines()) == 2


def test_a_restart_starts_the_successor_pull_at_once_within_the_jobs_lease(busybox: str, service_router: Router,
                                                                           base: pathlib.Path,
                                                                           cluster: ClusterDouble) -> None:
    """Issue 23 item 3: ``/etc/init.d/qinglong-edge restart`` (and the package's postinst,
    which runs the same start) with a job in flight. procd stops the resident pull with
    SIGTERM (its jobs go on); the start runs one pull at once as the service user, which
    re-adopts the job and renews its 30 s lease in time, instead of the next cron minute
    (a pull 35 s later found the lease gone). Here procd's two steps are done as procd
    does them: SIGTERM to the instance's pid, then the command the start declared."""
    router = service_router
    device = PullEnv(base / "device", cluster)
    _chown_tree(base / "device")
    router.edit_uci(worker_options(device))
    traces = base / "traces"
    traces.mkdir(mode=0o777)
    traces.chmod(0o777)
    cluster.state.candidates.clear()
    task = cluster.add_command_task(f"echo started >> {traces}/job; while [ ! -e {traces}/go ]; do sleep 0.05; done")
    lease_ms = 30_000  # the double's default, the reference's run lease

    outputs: list[pathlib.Path] = []

    def procd_start() -> subprocess.Popen[bytes]:
        assert router.call(busybox, "start_service").returncode == 0
        argv = router.procd_param("command", "pull")
        assert router.procd_param("user", "pull") == ["nobody"]
        outputs.append(base / f"pull-{len(outputs)}.out")  # procd sends it to logread; the events say why
        with outputs[-1].open("wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, cwd="/",
                                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, user=SERVICE_UID,
                                    group=SERVICE_UID, extra_groups=[])

    first = procd_start()
    successor = None
    try:
        if not wait_until((traces / "job").exists, timeout=60):
            first.kill()
            _, stderr = first.communicate(timeout=30)
            records = sorted(str(p.relative_to(device.root)) for p in device.root.rglob("*") if p.is_file())
            failures = [e.body.decode(errors="replace") for e in cluster.exchanges if e.op == "start-failure"]
            offers = [p.read_text(errors="replace") for p in (device.root / "state" / "worker" / "offers").glob("*.json")]
            raise AssertionError(f"the job never started; pull's stderr: {stderr.decode(errors='replace')!r}; "
                                 f"exchanges: {[e.op for e in cluster.exchanges]}; files: {records}; "
                                 f"start-failure bodies: {failures}; offers: {offers}; "
                                 f"pull's output: {outputs[0].read_text(errors='replace')!r}")
        assert wait_until(lambda: any(e.op == "lease-control" for e in cluster.exchanges), timeout=30)
        # restart = stop (stop_service, procd SIGTERMs the instance's pid) + start
        assert router.call(busybox, "stop_service").returncode == 0
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        stopped_at = time.monotonic()
        mark = len(cluster.exchanges)
        successor = procd_start()
        assert wait_until(lambda: any(e.op == "lease-control" for e in cluster.exchanges[mark:]), timeout=30)
        taken_over_s = time.monotonic() - stopped_at
        (traces / "go").touch()
        assert successor.wait(timeout=60) == 0, successor.stderr.read() if successor.stderr else ""
    finally:
        (traces / "go").touch()
        for proc in (first, successor):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert taken_over_s < lease_ms / 1000 / 3, taken_over_s  # well within the lease: not the next cron minute
    assert (traces / "job").read_text().count("started") == 1
    assert cluster.completion(task.candidate["runId"])["status"] == "succeeded"
    assert [f for f in cluster.fence_reasons() if f.reason == "lease_expired"] == []


def _standin_pull(base: pathlib.Path, then: str) -> pathlib.Path:
    """A stand-in for ``qinglong-edge ... pull`` that starts a real job under the job
    wrapper, as a resident pull does, writes the wrapper's pid to ``job.pid``, then
    ``then`` (``exit``: what a resident pull stopped by SIGTERM or a crash does, leaving
    its job running; ``wait``: stays, as while it supervises)."""
    program = base / "standin-pull"
    program.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support.jobs import start_job\n"
        f"job = start_job('echo started; exec sleep 100071', {str(base)!r})\n"
        f"with open({str(base / 'job.pid')!r}, 'w') as out:\n"
        "    out.write(str(job.pid))\n"
        "print('pull: left a job', file=sys.stderr)\n"
        + ("time.sleep(120)\n" if then == "wait" else "")
    )
    program.chmod(0o755)
    return program


def test_the_cron_line_ends_with_the_pull_and_never_takes_its_job(busybox: str, router: Router,
                                                                  base: pathlib.Path) -> None:
    """busybox crond (miscutils/crond.c) has no timeout and kills nothing it started; it
    starts a line again only after the previous run of that line has exited, and puts each
    run in a process group of its own (bb_setpgrp). So the shipped line needs no change for
    a resident pull, provided the line ends when pull does, although pull leaves a remote
    job running (the job holds no descriptor of the line: not the logger pipe), and that a
    signal to the line's process group never reaches the job (it has a session of its
    own). Both checked here with the shipped line, busybox sh and a real job."""
    (line,) = [line for line in (router.root / "etc/crontabs/qinglong").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    router.rundir.mkdir(parents=True)
    (router.rundir / "pull.enabled").touch()
    logger = base / "bin/logger"
    logger.parent.mkdir()
    logger.write_text(f'#!/bin/sh\ncat >> {base / "syslog"}\n')
    logger.chmod(0o755)
    env = {"PATH": f"{logger.parent}:/usr/bin:/bin"}
    jobs: list[int] = []
    try:
        for then in ("exit", "wait"):
            command = line.split(maxsplit=5)[5].replace("/var/etc/qinglong-edge", str(router.rundir))
            command = command.replace("/usr/bin/qinglong-edge", str(_standin_pull(base, then)))
            (base / "job.pid").unlink(missing_ok=True)
            cron = subprocess.Popen([busybox, "sh", "-c", command], env=env, cwd="/", start_new_session=True)
            assert wait_until((base / "job.pid").exists, timeout=30)
            job = int((base / "job.pid").read_text())
            jobs.append(job)
            if then == "wait":
                os.killpg(cron.pid, signal.SIGTERM)  # the line's own group: the stand-in and logger
            assert cron.wait(timeout=30) == (0 if then == "exit" else -signal.SIGTERM)
            assert alive(job), then  # the job outlived the line, in a session of its own
            assert os.getsid(job) == job
            if then == "exit":
                assert (base / "syslog").read_text() == "pull: left a job\n"  # the line's logger got pull's stderr
    finally:
        for job in jobs:
            with contextlib.suppress(OSError):
                os.killpg(job, signal.SIGKILL)
