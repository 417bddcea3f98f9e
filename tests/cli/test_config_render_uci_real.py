"""`config render-uci` against what OpenWrt's real `uci` prints (openwrt/uci 66127cd, built by
tests/support/openwrt_tools.py), on a private config directory (`uci -c`) and delta directory
(`uci -t`): the README's `uci set ...; uci commit` sequence on the shipped defaults, then lists
and values with quotes and spaces; and the stand-in `uci show` the other tests use
(tests/support/uci.py) checked against the real one."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex

import pytest

from qinglong_edge.commands.config import UCI_PACKAGE
from tests.support.cli import REPO, run_cli
from tests.support.openwrt_tools import OpenwrtTools, RealUci
from tests.support.uci import uci_file_to_show

SHIPPED_UCI = pathlib.Path(REPO) / "packaging" / "files" / "openwrt" / "qinglong-edge.uci"
README = pathlib.Path(REPO) / "README.md"
P = UCI_PACKAGE


def readme_uci_commands() -> list[list[str]]:
    """Every ``uci set`` / ``uci add_list`` / ``uci commit`` the README tells an OpenWrt user to
    run, in README order (inline code and code blocks; ``a; b`` split; ``reload_config`` is
    procd's, not uci's), as argv after ``uci``."""
    text = README.read_text()
    snippets = []
    for match in re.finditer(r"^```sh\n(.*?)^```|`(uci [^`\n]+)`", text, re.MULTILINE | re.DOTALL):
        snippets += [line for line in (match.group(1) or match.group(2)).splitlines() if line.startswith("uci ")]
    commands = []
    for snippet in snippets:
        if "..." in snippet:  # prose about the commands ("`uci set ...; uci commit`"), not one to run
            continue
        for part in snippet.split(";"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["uci"] and words[1:2] and words[1] in ("set", "add_list", "commit"):
                commands.append(words[1:])
    return commands


@pytest.fixture
def uci(openwrt_tools: OpenwrtTools, tmp_path: pathlib.Path) -> RealUci:
    """The real uci with the package's shipped defaults as /etc/config/qinglong-edge."""
    real = RealUci(openwrt_tools, tmp_path / "uci")
    (real.confdir / P).write_text(SHIPPED_UCI.read_text())
    return real


def _render(uci: RealUci, tmp_path: pathlib.Path) -> tuple[int, str, str]:
    """``qinglong-edge config render-uci`` with plain ``uci`` on PATH running the real one."""
    bin_dir = uci.wrapper(tmp_path / "bin").parent
    result = run_cli("config", "render-uci", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    return result.status, result.stdout, result.stderr


def test_the_readme_names_the_whole_sequence() -> None:
    commands = readme_uci_commands()
    assert ["set", f"{P}.worker.origin=https://cluster.example:7443"] in commands
    for role in ("worker", "local_api", "execution", "main"):
        assert ["set", f"{P}.{role}.enabled=1"] in commands
    assert commands[-1] == ["commit", P]


def test_readme_sequence_then_lists_quotes_and_spaces(uci: RealUci, tmp_path: pathlib.Path) -> None:
    uci.batch(readme_uci_commands())
    uci.batch([
        ["set", f"{P}.main.state_directory=/srv/edge \"state\" dir"],
        ["set", f"{P}.worker.credential_file=/etc/qinglong-edge/bob's worker.credential"],
        ["add_list", f"{P}.worker.trust_anchor_file=/etc/qinglong-edge/ca two.pem"],
        ["add_list", f"{P}.worker.trust_anchor_file=/etc/qinglong-edge/o'neil ca.pem"],
        ["set", f"{P}.worker.request_timeout_ms=20000"],
        ["set", f"{P}.execution.log_directory=/tmp/qinglong edge/logs"],
        ["set", f"{P}.local_api.port=5701"],
        ["commit", P],
    ])
    assert not any(uci.savedir.iterdir()) or all(p.stat().st_size == 0 for p in uci.savedir.iterdir())
    show = uci("-q", "show", P)
    assert show.status == 0, show
    assert f"{P}.worker.trust_anchor_file='/etc/qinglong-edge/cluster-ca.pem' '/etc/qinglong-edge/ca two.pem' " \
           f"'/etc/qinglong-edge/o'\\''neil ca.pem'\n" in show.stdout
    status, stdout, stderr = _render(uci, tmp_path)
    assert status == 0, stderr
    assert json.loads(stdout) == {
        "schema": "qinglong/edge-agent@v1",
        "profile": "edge",
        "stateDirectory": '/srv/edge "state" dir',
        "worker": {
            "origin": "https://cluster.example:7443",
            "workerId": "edge-1",
            "credentialFile": "/etc/qinglong-edge/bob's worker.credential",
            "certificateFile": "/etc/qinglong-edge/worker.crt",
            "privateKeyFile": "/etc/qinglong-edge/worker.key",
            "trustAnchorFiles": ["/etc/qinglong-edge/cluster-ca.pem", "/etc/qinglong-edge/ca two.pem",
                                 "/etc/qinglong-edge/o'neil ca.pem"],
            "runtimeDirectory": "/var/run/qinglong-edge",  # the shipped UCI default (RAM)
            "logDirectory": "/tmp/qinglong-edge/remote-logs",  # the shipped UCI default (RAM)
            "requestTimeoutMs": 20000,
            "capabilitiesFile": "/etc/qinglong-edge/capabilities.json",  # the README's capabilities step
        },
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5701}},
        "execution": {"logDirectory": "/tmp/qinglong edge/logs",
                      "workDirectory": "/tmp/qinglong-edge/work"},  # the shipped UCI default (RAM)
    }


def test_uncommitted_changes_are_rendered_too(uci: RealUci, tmp_path: pathlib.Path) -> None:
    """`uci show` includes staged changes (the delta directory), as on a router before `uci commit`."""
    uci.batch([["set", f"{P}.main.profile=standalone"]])
    assert any(p.stat().st_size for p in uci.savedir.iterdir())
    status, stdout, stderr = _render(uci, tmp_path)
    assert status == 0, stderr
    assert json.loads(stdout)["profile"] == "standalone"


def test_replacing_a_list_and_an_invalid_value_name_the_option(uci: RealUci, tmp_path: pathlib.Path) -> None:
    uci.batch(readme_uci_commands())
    uci.batch([["delete", f"{P}.worker.trust_anchor_file"],
               ["add_list", f"{P}.worker.trust_anchor_file=relative.pem"], ["commit", P]])
    status, _, stderr = _render(uci, tmp_path)
    assert status == 78
    assert stderr.startswith(f"qinglong-edge: invalid_configuration: {P}.worker.trust_anchor_file: "
                             "must be an absolute path"), stderr
    uci.batch([["delete", f"{P}.worker.trust_anchor_file"], ["add_list", f"{P}.worker.trust_anchor_file=/a.pem"],
               ["set", f"{P}.worker.request_timeout_ms=999"], ["commit", P]])
    status, _, stderr = _render(uci, tmp_path)
    assert status == 78
    assert stderr.startswith(f"qinglong-edge: invalid_configuration: {P}.worker.request_timeout_ms: "
                             "must be an integer from 1000 to 60000"), stderr


def test_an_unnamed_section_is_shown_by_index_and_rendered(uci: RealUci, tmp_path: pathlib.Path) -> None:
    text = SHIPPED_UCI.read_text().replace("config local_api 'local_api'", "config local_api")
    (uci.confdir / P).write_text(text)
    uci.batch([["set", f"{P}.@local_api[0].enabled=1"], ["set", f"{P}.@local_api[0].port=5702"], ["commit", P]])
    show = uci("-q", "show", P)
    assert f"{P}.@local_api[0]=local_api\n" in show.stdout
    status, stdout, stderr = _render(uci, tmp_path)
    assert status == 0, stderr
    assert json.loads(stdout)["localApi"] == {"listener": {"host": "127.0.0.1", "port": 5702}}


@pytest.mark.parametrize("edits", [
    pytest.param([], id="shipped-defaults"),
    pytest.param("readme", id="after-the-readme-sequence"),
    pytest.param([["set", f"{P}.worker.credential_file=/a b/it's"], ["add_list", f"{P}.worker.trust_anchor_file="],
                  ["add_list", f"{P}.worker.trust_anchor_file=/x \"y\""], ["set", f"{P}.main.profile="],
                  ["commit", P]], id="quotes-spaces-empty-items"),
])
def test_the_stand_in_uci_show_matches_the_real_one(uci: RealUci, edits: list[list[str]] | str) -> None:
    """tests/support/uci.py turns a config file into `uci show` text for tests without the real
    uci: on the files the real uci writes it must print exactly what the real uci prints."""
    uci.batch(readme_uci_commands() if edits == "readme" else edits)
    real = uci("-q", "show", P)
    assert real.status == 0, real
    assert uci_file_to_show((uci.confdir / P).read_text(), P) == real.stdout
