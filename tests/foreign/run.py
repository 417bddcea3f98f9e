"""`make test-foreign`: the zipapp in Debian bookworm arm64, armhf and mipsel roots under qemu-user.

usage: python3 -m tests.foreign.run [--arch arm64,armhf,mipsel] [--cycles N] [--rebuild] [--zipapp PYZ]

Needs root, ``debootstrap``, ``qemu-user-static`` and ``binfmt-support`` (Debian packages;
tests/foreign/roots.py registers the binfmt_misc handlers when a container has not), and
the network the first time (each root is ``debootstrap --variant=minbase
--include=python3 bookworm``, cached in ``var/foreign/``). Not part of ``make test`` nor
of ``.ci/run``.

For each architecture ``qinglong-edge.pyz`` (built from this checkout) runs inside the root
with ``chroot ROOT /usr/bin/python3 -I /opt/qinglong-edge/qinglong-edge.pyz`` (Debian's
CPython 3.11 for that architecture, emulated by qemu-user), against the cluster double and
the Local API client of tests/support on the host's loopback (a chroot shares the network
namespace); the scenario's directory is bind-mounted at the same path inside, so the
configs name the same paths on both sides. One line per architecture and step::

    ARCH        STEP              PASS|FAIL|SKIP  SECONDS  DETAIL

What PASS means:

* ``version``: exit 0, this checkout's version, Python >= 3.11; the detail gives ``uname -m``
  inside the root;
* ``doctor``: a config with ``worker``, ``localApi`` and ``execution``. arm64, armhf: exit 0.
  mipsel: the worker role is unsupported on mips/mipsel (decided by the worker issue, 18):
  exit non-zero with a failed required check whose detail or remedy names the machine;
* ``admin init``: ``admin init``, two subjects, role grants, credentials, a task: exit 0 each;
* ``serve``: listening; ``task.start+cancel``: a Run started over the Local API, cancelled
  (202), ``cancelled``, its process gone after SIGTERM (no cgroup inside a chroot: the setsid
  escapee is not expected to die; it is killed with the root's other processes at the end);
  ``serve stop``: SIGTERM, exit 0;
* ``pull``: one cycle with one ``shell`` task queued in the double. arm64: ``accepted``
  (``new_claim``), the offer in the inbox. armhf (``armv7l`` -> ``arm/v7``, support tier
  ``experimental``; the double's default placement asks for ``tier1``): ``idle``
  (``no_match``). mipsel: exit 78 with ``unsupported_architecture`` on stderr, and a second
  cycle exit 78 saying nothing (one line per boot, then quiet);
* ``pull idle``: N more cycles, each checked (exit 0, ``idle``; mipsel: exit 78), with
  the median wall time and peak RSS (``ru_maxrss`` of the chroot'd process from ``wait4``:
  under qemu-user that is the emulator's memory too, translated code included, so it is
  larger than the same cycle natively). The ``host`` line is the same cycle run natively
  with the host's ``/usr/bin/python3``, for comparison.

Exit status: 0 when every step passed, 1 when one failed, 2 when this machine cannot run
the roots (the message says what to install).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "packaging") not in sys.path:
    sys.path.insert(0, str(REPO / "packaging"))

from qinglong_edge import __version__  # noqa: E402
from tests.foreign.roots import (  # noqa: E402
    ARCHITECTURES,
    ZIPAPP_IN_ROOT,
    Chroot,
    ForeignArch,
    HostUnfit,
    check_host,
    ensure_root,
)
from tests.support.cli import Entry  # noqa: E402
from tests.support.cluster_double import ClusterDouble  # noqa: E402
from tests.support.local_site import LocalSite, Serve, cancel_and_verify, free_port, start_running  # noqa: E402
from tests.support.pull_env import PullEnv  # noqa: E402

ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
#: Emulated CPython is 5-20x slower: generous request timeout; no heartbeat inside the
#: measured cycles (as benchmarks/bench_pull.py).
WORKER = {"requestTimeoutMs": 15000, "sessionLeaseDurationMs": 600000, "heartbeatIntervalMs": 300000}
TIMEOUT_S = 300
UNSUPPORTED_WORKER = frozenset({"mipsel"})


class StepFailed(Exception):
    """A step's expectation was not met; the message says what was seen."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def _tail(text: str, lines: int = 2) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-300:]


class Report:
    """Prints one line per step; counts failures."""

    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0

    def line(self, arch: str, step: str, verdict: str, seconds: float | None, detail: str) -> None:
        took = f"{seconds:7.1f} s" if seconds is not None else "        -"
        print(f"{arch:<11} {step:<17} {verdict:<4} {took}  {detail}", flush=True)

    def step(self, arch: str, step: str, action: Callable[[], str]) -> bool:
        started = time.monotonic()
        try:
            detail = action()
        except (StepFailed, AssertionError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
            self.failed += 1
            self.line(arch, step, "FAIL", time.monotonic() - started, f"{type(exc).__name__}: {exc}"[:400])
            return False
        self.passed += 1
        self.line(arch, step, "PASS", time.monotonic() - started, detail)
        return True

    def skip(self, arch: str, step: str, why: str) -> None:
        self.failed += 1
        self.line(arch, step, "SKIP", None, why)


#: Spawns argv[2:] and writes its exit status, wall time and wait4 peak RSS to argv[1]. A
#: fresh ``python3 -I -S`` (a few MiB) does the spawning because ru_maxrss counts the
#: memory a child had before exec, i.e. its parent's: spawned from this runner (the cluster
#: double's threads and TLS included) every figure would be at least the runner's RSS.
MEASURE = r"""
import json, os, sys, time
report, argv = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
pid = os.posix_spawn(argv[0], argv, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = (time.perf_counter() - started) * 1000
with open(report, "w") as handle:
    json.dump({"status": os.waitstatus_to_exitcode(status), "wall_ms": wall, "maxrss_kib": usage.ru_maxrss}, handle)
"""


def _measure(argv: Sequence[str], env: dict[str, str], cwd: str, out: pathlib.Path) -> tuple[int, float, float, str]:
    """Run one process to completion: ``(exit status, wall ms, peak RSS MiB, stdout+stderr)``."""
    program = shutil.which(argv[0]) or argv[0]
    report = out.with_suffix(".rusage.json")
    with open(out, "wb") as handle:
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", MEASURE, str(report), program, *argv[1:]],
                              stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=TIMEOUT_S,
                              check=False)
    output = out.read_text(errors="replace")
    _check(proc.returncode == 0 and report.exists(), f"the measuring helper failed: {_tail(output)}")
    figures = json.loads(report.read_text())
    return int(figures["status"]), float(figures["wall_ms"]), figures["maxrss_kib"] / 1024, output


class Scenario:
    """One architecture's steps against one cluster double (see the module docstring)."""

    def __init__(self, name: str, python: Sequence[str], pyz: str, workdir: pathlib.Path, cluster: ClusterDouble, *,
                 cycles: int, worker_supported: bool) -> None:
        self.name = name
        self.python = tuple(python)  # the interpreter's argv prefix (chroot ROOT /usr/bin/python3, or the host's)
        self.entry = Entry(name, (*self.python, "-I", pyz), ENV, str(workdir))
        self.workdir = workdir
        self.cluster = cluster
        self.cycles = cycles
        self.worker_supported = worker_supported
        (workdir / "worker").mkdir()
        (workdir / "local").mkdir()
        cluster.reset(tasks=("shell",))
        self.device = PullEnv(workdir / "worker", cluster, entry=self.entry, **WORKER)
        self.site = LocalSite(workdir / "local", self.entry)
        self.serve: Serve | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.entry.argv(*args), capture_output=True, text=True, env=self.entry.environment(),
                              cwd=self.entry.cwd, timeout=TIMEOUT_S, check=False)

    # -- steps ---------------------------------------------------------------------------------------

    def version(self, machine: str) -> str:
        proc = self.cli("version", "--json")
        _check(proc.returncode == 0, f"exit {proc.returncode}: {_tail(proc.stderr)}")
        answer = json.loads(proc.stdout)
        _check(answer.get("version") == __version__, f"version {answer.get('version')!r}, expected {__version__}")
        python = tuple(int(part) for part in str(answer.get("python", "0")).split(".")[:2])
        _check(python >= (3, 11), f"Python {answer.get('python')}")
        return f"qinglong-edge {answer['version']}, Python {answer['python']}, uname -m {machine}"

    def doctor(self) -> str:
        document = json.loads(self.device.config_path.read_text())
        document["localApi"] = {"listener": {"host": "127.0.0.1", "port": free_port()}}
        document["execution"] = {}
        pepper = self.device.state_dir / "pepper"
        pepper.mkdir(mode=0o700, exist_ok=True)
        config = self.workdir / "doctor.json"
        config.write_text(json.dumps(document))
        proc = self.cli("--config", str(config), "doctor", "--json")
        try:
            answer = json.loads(proc.stdout)
        except ValueError:
            raise StepFailed(f"exit {proc.returncode}, no JSON: {_tail(proc.stdout + proc.stderr)}") from None
        failed = [c for c in answer.get("checks", []) if c.get("required") and not c.get("ok")]
        if self.worker_supported:
            _check(proc.returncode == 0 and answer.get("ok") is True,
                   f"exit {proc.returncode}, failed: {[(c['name'], c['detail']) for c in failed]}")
            return f"{len(answer['checks'])} checks, all required passed"
        naming = [c for c in failed if "mips" in f"{c.get('detail', '')} {c.get('remedy', '')}".lower()]
        _check(proc.returncode != 0 and answer.get("ok") is False and bool(naming),
               f"expected a failed required worker check naming mips; exit {proc.returncode}, "
               f"failed: {[(c['name'], c['detail']) for c in failed]}")
        return f"worker unsupported: {naming[0]['name']}: {naming[0]['detail']}"

    def admin(self) -> str:
        self.site.provision()
        return "admin init, 2 subjects, 2 role grants, 2 credentials, task looper"

    def start_serve(self) -> str:
        stderr_path = self.site.root / "serve.stderr"
        with open(stderr_path, "wb") as stderr:
            proc = self.entry.popen("--config", str(self.site.config), "serve", stdout=subprocess.DEVNULL,
                                    stderr=stderr)
        self.serve = Serve(proc, stderr_path)
        self.serve.wait_serving(timeout=TIMEOUT_S)
        return f"listening on 127.0.0.1:{self.site.port}"

    def cancel(self) -> str:
        run = start_running(self.site)
        cancel_and_verify(self.site, run, escapee_dies=False)
        return f"run {run.run_id[:8]}... cancelled, job pid {run.pid} gone after SIGTERM"

    def stop_serve(self) -> str:
        assert self.serve is not None
        status = self.serve.stop(timeout=TIMEOUT_S)
        _check(status == 0, f"serve exited {status}: {_tail(self.serve.stderr())}")
        return "SIGTERM -> exit 0"

    def pull(self) -> str:
        if not self.worker_supported:
            # As cron runs it (the crontab sends stderr to logd): one line, then quiet.
            outcome = self.device.pull(timeout=TIMEOUT_S)
            lines = outcome.stderr.strip().splitlines()
            _check(outcome.status == 78 and len(lines) == 1 and "unsupported_architecture" in lines[0],
                   f"expected exit 78 and one unsupported_architecture line; exit {outcome.status}: "
                   f"{_tail(outcome.stdout + outcome.stderr)}")
            again = self.device.pull(timeout=TIMEOUT_S)
            _check(again.status == 78 and again.stderr.strip() == "",
                   f"second cycle: expected exit 78 and nothing said; exit {again.status}: {_tail(again.stderr)}")
            return f"exit 78, said once: {lines[0][:200]}"
        outcome = self.device.pull("--json", timeout=TIMEOUT_S)
        _check(outcome.status == 0, f"exit {outcome.status}: {_tail(outcome.stdout + outcome.stderr)}")
        line = outcome.last()
        seen = (line.get("status"), line.get("reason"))
        if self.name == "armhf":
            _check(seen == ("idle", "no_match"), f"expected idle (no_match) for tier experimental, got {seen}")
            return "idle (no_match): arm/v7 is support tier experimental, the task asks tier1"
        _check(seen == ("accepted", "new_claim"), f"expected accepted (new_claim), got {seen}")
        _check(list(self.device.inbox()) == [line["offerId"]], "the offer is not in the inbox")
        return f"accepted (new_claim), offer {line['offerId'][:8]}... in the inbox"

    def idle_cycles(self) -> str:
        walls, rss = [], []
        for index in range(self.cycles):
            argv = self.device.argv("--json") if self.worker_supported else self.device.argv()
            status, wall, peak, output = _measure(argv, self.entry.environment(),
                                                  self.entry.cwd, self.workdir / f"cycle-{index}.out")
            if self.worker_supported:
                _check(status == 0 and '"status":"idle"' in output.replace(" ", ""),
                       f"cycle {index}: exit {status}: {_tail(output)}")
            else:
                _check(status == 78, f"cycle {index}: exit {status}: {_tail(output)}")
            walls.append(wall)
            rss.append(peak)
        bare_walls, bare_rss = [], []
        for index in range(3):
            status, wall, peak, output = _measure([*self.python, "-I", "-c", "pass"], self.entry.environment(),
                                                  self.entry.cwd, self.workdir / f"bare-{index}.out")
            _check(status == 0, f"python3 -I -c pass: exit {status}: {_tail(output)}")
            bare_walls.append(wall)
            bare_rss.append(peak)
        what = "idle cycle" if self.worker_supported else "refused cycle (exit 78)"
        return (f"{what}: wall {statistics.median(walls):.0f} ms median ({min(walls):.0f}-{max(walls):.0f}), "
                f"peak RSS {statistics.median(rss):.1f} MiB median (max {max(rss):.1f}) over {self.cycles}; "
                f"bare python3 -I -c pass: {statistics.median(bare_walls):.0f} ms, "
                f"{statistics.median(bare_rss):.1f} MiB")


def run_foreign(arch: ForeignArch, root: pathlib.Path, zipapp: bytes, cluster: ClusterDouble, report: Report, *,
                cycles: int) -> None:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"qle-foreign-{arch.debian}-", dir="/tmp"))
    try:
        with Chroot(root, workdir, zipapp):
            machine = subprocess.run(["chroot", str(root), "uname", "-m"], capture_output=True, text=True,
                                     check=False, timeout=60).stdout.strip()
            scenario = Scenario(arch.debian, ("chroot", str(root), "/usr/bin/python3"), ZIPAPP_IN_ROOT, workdir, cluster,
                                cycles=cycles,
                                worker_supported=arch.debian not in UNSUPPORTED_WORKER)
            name = arch.debian
            report.step(name, "version", lambda: scenario.version(machine))
            report.step(name, "doctor", scenario.doctor)
            if report.step(name, "admin init", scenario.admin):
                if report.step(name, "serve", scenario.start_serve):
                    report.step(name, "task.start+cancel", scenario.cancel)
                    report.step(name, "serve stop", scenario.stop_serve)
                else:
                    report.skip(name, "task.start+cancel", "serve did not start")
            else:
                report.skip(name, "serve", "admin init failed")
            if report.step(name, "pull", scenario.pull):
                report.step(name, "pull idle", scenario.idle_cycles)
            else:
                report.skip(name, "pull idle", "the first pull failed")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_host(pyz: pathlib.Path, cluster: ClusterDouble, report: Report, cycles: int) -> None:
    """The same pull cycles natively, with the host's Debian python3 (the roots' CPython 3.11)."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="qle-foreign-host-", dir="/tmp"))
    try:
        scenario = Scenario("host", (python,), str(pyz), workdir, cluster, cycles=cycles, worker_supported=True)
        name = f"host {platform.machine()}"
        if report.step(name, "pull", scenario.pull):
            report.step(name, "pull idle", scenario.idle_cycles)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _zipapp() -> bytes:
    from qle_dist.reproducible import source_date_epoch
    from qle_dist.zipapp import build_zipapp

    try:
        epoch = source_date_epoch(REPO)
    except ValueError:
        epoch = 315532800
    return build_zipapp(epoch)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.foreign.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default=",".join(ARCHITECTURES),
                        help=f"comma-separated, from {', '.join(ARCHITECTURES)} (default: all)")
    parser.add_argument("--cycles", type=int, default=5, help="idle pull cycles measured per architecture (5)")
    parser.add_argument("--rebuild", action="store_true", help="debootstrap the roots again")
    parser.add_argument("--zipapp", type=pathlib.Path, help="run this qinglong-edge.pyz (default: build this checkout's)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.arch.split(",") if name.strip()]
    unknown = [name for name in names if name not in ARCHITECTURES]
    if unknown or not names or args.cycles < 1:
        parser.error(f"unknown architecture(s) {unknown}" if unknown else "nothing to run")
    arches = [ARCHITECTURES[name] for name in names]
    started = time.monotonic()
    print(f"test-foreign {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: qinglong-edge {__version__}, "
          f"host {platform.machine()} Linux {platform.release()}, {os.cpu_count()} CPUs", flush=True)
    try:
        for line in check_host(arches):
            print(f"binfmt  {line}", flush=True)
        roots = {}
        for arch in arches:
            root, how = ensure_root(arch, rebuild=args.rebuild)
            roots[arch.debian] = root
            print(f"root    {arch.debian}: {root} {how}", flush=True)
    except HostUnfit as exc:
        print(f"test-foreign: {exc}", file=sys.stderr)
        return 2
    qemu = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True, check=False)
    print(f"qemu    {qemu.stdout.splitlines()[0] if qemu.stdout else 'unknown'}", flush=True)
    zipapp = args.zipapp.read_bytes() if args.zipapp else _zipapp()
    report = Report()
    with ClusterDouble() as cluster, tempfile.TemporaryDirectory(prefix="qle-foreign-pyz-") as holder:
        for arch in arches:
            run_foreign(arch, roots[arch.debian], zipapp, cluster, report, cycles=args.cycles)
        pyz = pathlib.Path(holder) / "qinglong-edge.pyz"
        pyz.write_bytes(zipapp)
        run_host(pyz, cluster, report, args.cycles)
    print(f"test-foreign: {report.passed} passed, {report.failed} failed or skipped "
          f"in {time.monotonic() - started:.0f} s (RSS under qemu-user includes the emulator)", flush=True)
    return 0 if report.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
