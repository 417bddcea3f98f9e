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
  a cluster double / a Local site in a temporary directory, with short timeouts.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

from tests.support.cli import Entry, split_entry
from tests.support.local_site import FAST_EXECUTION, LocalSite
from tests.support.pull_env import FAST_WORKER, PullEnv
from tests.support.uci import set_uci_options, uci_file_to_show

__all__ = ["installed_entry", "local_options", "render_from_uci", "worker_options"]

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
    }
    worker.update({_uci_name(key): str(value) for key, value in FAST_WORKER.items()})
    return {"main": {"state_directory": str(device.state_dir)}, "worker": worker}


def local_options(site: LocalSite) -> UciEdits:
    """UCI edits for the Local API on ``site``'s port and an execution controller with short graces."""
    execution: dict[str, str | Sequence[str]] = {"enabled": "1", "log_directory": str(site.state / "logs")}
    execution.update({_uci_name(key): str(value) for key, value in FAST_EXECUTION.items()})
    return {
        "main": {"state_directory": str(site.state)},
        "local_api": {"enabled": "1", "host": "127.0.0.1", "port": str(site.port)},
        "execution": execution,
    }
