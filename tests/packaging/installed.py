"""Run an installed qinglong-edge (the ipk unpacked into an offline root, or the tarball
staged with ``install.sh --destdir``) the way a router does, for end-to-end tests.

* :func:`installed_entry`: the root's launcher ``<prefix>/bin/qinglong-edge`` under
  ``python3 -I -S -B -v`` with the OpenWrt split blocker (only the modules of the
  packages our ``Depends:`` line brings), so the code that runs is the root's
  ``<prefix>/lib/qinglong-edge`` and the module set is the router's;
* :func:`render_from_uci`: the root's own ``/etc/config/qinglong-edge``, edited as
  ``uci set`` would, rendered by the installed ``config render-uci`` (what the init
  script does on every start) into the agent's JSON config;
* :func:`worker_options` / :func:`local_options`: the UCI edits that point a device at
  a cluster double / a Local site in a temporary directory, with short timeouts;
* :class:`Router`: the root's procd init script under busybox sh and stubs of
  ``/lib/functions.sh`` and procd (:mod:`tests.support.openwrt_stubs`).
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

from qinglong_edge.config import EdgeConfig
from tests.packaging.conftest import Unpacked
from tests.support.cli import Entry, split_entry
from tests.support.local_site import FAST_EXECUTION, LocalSite
from tests.support.openwrt_stubs import PROCD_SH, make_root, read_log
from tests.support.pull_env import FAST_WORKER, PullEnv
from tests.support.uci import install_fake_uci, set_uci_options, uci_file_to_show

__all__ = ["STOP_MARGIN_S", "Router", "installed_entry", "local_options", "render_from_uci", "serve_stop_seconds",
           "worker_options"]

#: What a service manager's stop timeout adds to :func:`serve_stop_seconds`: the store
#: closing and the interpreter exiting (seconds).
STOP_MARGIN_S = 4

UciEdits = Mapping[str, Mapping[str, str | Sequence[str]]]


def installed_entry(root: pathlib.Path, *, cwd: pathlib.Path, prefix: str = "usr",
                    installed: Sequence[str] | None = None, report: str = "") -> Entry:
    """The launcher ``<root>/<prefix>/bin/qinglong-edge`` under the OpenWrt split, verbose
    (``installed``, ``report``: see :func:`tests.support.cli.split_entry`)."""
    return split_entry(root / prefix / "bin" / "qinglong-edge", cwd=cwd, flags=("-v",), installed=installed,
                       report=report, name="installed")


def render_from_uci(entry: Entry, root: pathlib.Path, edits: UciEdits, output: pathlib.Path) -> None:
    """Edit ``<root>/etc/config/qinglong-edge`` (a copy: the root is not changed), render it
    with ``config render-uci --input`` through ``entry`` into ``output``."""
    text = (root / "etc" / "config" / "qinglong-edge").read_text()
    for section, options in edits.items():
        text = set_uci_options(text, section, options)
    dump = output.with_name(output.name + ".uci-show")
    dump.write_text(uci_file_to_show(text, "qinglong-edge"))
    result = entry.run("config", "render-uci", "--input", str(dump), "--output", str(output))
    assert result.status == 0, result.stdout + result.stderr[-4000:]


def serve_stop_seconds(config: EdgeConfig) -> int:
    """How long ``serve`` may take to exit after SIGTERM with ``config``, from the code:
    the HTTP drain (the profile's drain timeout plus the second
    :meth:`~qinglong_edge.local.server.Server.shutdown` allows its threads) runs at the
    same time as the execution controller's stop
    (:attr:`~qinglong_edge.execution.controller.ExecutionController.stop_timeout_s`), so
    the longer of the two, rounded up to whole seconds."""
    from qinglong_edge.execution.controller import ExecutionController
    from qinglong_edge.local.exchange import ServerLimits

    drain = ServerLimits.for_profile(config.profile).drain_timeout_s + 1
    controller = 0.0
    if config.execution is not None:
        # The property reads only .config; no controller (pipes, threads) is built for it.
        controller = ExecutionController.stop_timeout_s.fget(SimpleNamespace(config=config.execution))  # type: ignore[attr-defined]
    return math.ceil(max(drain, controller))


def _uci_name(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def worker_options(device: PullEnv) -> UciEdits:
    """UCI edits for a Remote Worker pulling from ``device``'s cluster double."""
    worker: dict[str, str | Sequence[str]] = {
        "enabled": "1",
        "origin": device.cluster.origin,
        "worker_id": device.cluster.worker_id,
        "credential_file": device.files["credentialFile"],
        "certificate_file": device.files["certificateFile"],
        "private_key_file": device.files["privateKeyFile"],
        "trust_anchor_file": [device.files["trustAnchorFile"]],
        # Not the shipped /tmp/qinglong-edge/remote-logs: shared by every test (and run) of
        # the machine, a directory there another user made fails this one's launches.
        "log_directory": str(device.root / "remote-logs"),
    }
    worker.update({_uci_name(key): str(value) for key, value in FAST_WORKER.items()})
    return {"main": {"state_directory": str(device.state_dir)}, "worker": worker}


def local_options(site: LocalSite) -> UciEdits:
    """UCI edits for the Local API on ``site``'s port and an execution controller with short graces."""
    # Neither shipped /tmp/qinglong-edge default: the machine's tests (and runs) would share it.
    execution: dict[str, str | Sequence[str]] = {"enabled": "1", "log_directory": str(site.state / "logs"),
                                                 "work_directory": str(site.state / "work")}
    execution.update({_uci_name(key): str(value) for key, value in FAST_EXECUTION.items()})
    return {
        "main": {"state_directory": str(site.state)},
        "local_api": {"enabled": "1", "host": "127.0.0.1", "port": str(site.port)},
        "execution": execution,
    }


class Router:
    """The init script, with its OpenWrt paths moved into a temp root, under stub procd.

    ``root`` is a copy of the unpacked package plus :func:`make_root`'s files;
    ``set_uci(section__option=value)`` / ``edit_uci({section: {option: value}})`` edit
    ``<root>/etc/config/qinglong-edge`` and install a fake ``uci`` answering from it;
    ``call(busybox, "start_service")`` runs a function of the init script; ``procd()``
    is what it asked procd for. ``python`` and ``user`` (user, group) replace the
    script's ``/usr/bin/python3`` and ``qinglong:qinglong`` (tests that run the agent
    as an unprivileged stand-in user).
    """

    def __init__(self, unpacked: Unpacked, root: pathlib.Path, path: str, *, python: str = sys.executable,
                 user: tuple[str, str] = ("qinglong", "qinglong")) -> None:
        self.path = path
        self.root = make_root(root)
        shutil.copytree(unpacked.root, root, dirs_exist_ok=True, symlinks=True)
        self.rundir = root / "var/etc/qinglong-edge"
        self.state = root / "etc/qinglong-edge/state"
        self.logs = root / "tmp/qinglong-edge/logs"
        self.work = root / "tmp/qinglong-edge/work"
        self.remote_logs = root / "tmp/qinglong-edge/remote-logs"
        self.runtime = root / "var/run/qinglong-edge"
        self.log = root / "stub.log"
        init = (root / "etc/init.d/qinglong-edge").read_text()
        for old, new in (("/usr/bin/qinglong-edge", str(root / "usr/bin/qinglong-edge")),
                         ("/usr/bin/python3", python),
                         ("/var/etc/qinglong-edge", str(self.rundir)),
                         ("QLE_USER=qinglong\nQLE_GROUP=qinglong\n", f"QLE_USER={user[0]}\nQLE_GROUP={user[1]}\n")):
            assert old in init, old
            init = init.replace(old, new)
        self.init = root / "init-under-test"
        self.init.write_text(init)
        (root / "lib/procd.sh").write_text(PROCD_SH)
        self.uci = root / "etc/config/qinglong-edge"
        self.edit_uci({})

    def set_uci(self, **changes: str) -> None:
        """``section__option="value"`` edits (see :meth:`edit_uci`)."""
        edits: dict[str, dict[str, str]] = {}
        for key, value in changes.items():
            section, option = key.split("__")
            edits.setdefault(section, {})[option] = value
        self.edit_uci(edits)

    def edit_uci(self, edits: UciEdits) -> None:
        """The UCI file with the shipped paths moved into the root, then ``edits`` applied."""
        text = self.uci.read_text()
        text = text.replace("'/etc/qinglong-edge/state'", f"'{self.state}'")
        text = text.replace("'/tmp/qinglong-edge/logs'", f"'{self.logs}'")
        text = text.replace("'/tmp/qinglong-edge/work'", f"'{self.work}'")
        text = text.replace("'/tmp/qinglong-edge/remote-logs'", f"'{self.remote_logs}'")
        text = text.replace("'/var/run/qinglong-edge'", f"'{self.runtime}'")
        for section, options in edits.items():
            text = set_uci_options(text, section, options)
        self.uci.write_text(text)
        dump = self.root / "uci-show.txt"
        dump.write_text(uci_file_to_show(text, "qinglong-edge"))
        install_fake_uci(self.root / "bin", "qinglong-edge", dump)

    def script(self, commands: str) -> str:
        """Shell source: the stubs, the init script, then ``commands``."""
        return (f'. "$QLE_STUB_ROOT/lib/functions.sh"; . "$QLE_STUB_ROOT/lib/procd.sh"; '
                f'. "{self.init}"; {commands}')

    def env(self) -> dict[str, str]:
        """The environment :meth:`script` needs (fake uci and busybox applets on PATH)."""
        return {"PATH": f"{self.root / 'bin'}{os.pathsep}{self.path}",
                "QLE_STUB_ROOT": str(self.root), "QLE_STUB_LOG": str(self.log)}

    def call(self, busybox: str, function: str) -> subprocess.CompletedProcess[str]:
        if self.log.exists():
            self.log.unlink()
        return subprocess.run([busybox, "sh", "-c", self.script(function)], env=self.env(), capture_output=True,
                              text=True, check=False, timeout=120)

    def procd(self) -> list[str]:
        return [line for line in read_log(self.log) if line.startswith("procd_")]

    def procd_param(self, name: str, instance: str = "serve") -> list[str]:
        """The words after ``procd_set_param NAME`` (the one call with that name) in the
        procd instance ``instance`` (``serve``; ``pull``: the pull at once)."""
        current, found = None, []
        for line in self.procd():
            words = line.split()
            if words[0] == "procd_open_instance":
                current = words[1] if len(words) > 1 else ""
            elif words[:2] == ["procd_set_param", name] and current == instance:
                found.append(words[2:])
        (only,) = found
        return only
