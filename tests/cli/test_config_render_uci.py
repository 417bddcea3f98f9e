"""`qinglong-edge config render-uci`: UCI (`uci -q show`) -> validated JSON, atomically."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import stat
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.commands.config import UCI_PACKAGE, UCI_SCHEMA, render_uci_text
from qinglong_edge.config import load_config, parse_config
from qinglong_edge.contracts.uci import UciSection, format_show
from qinglong_edge.errors import ConfigError
from tests.support.cli import REPO, run_cli
from tests.support.uci import install_fake_uci, uci_file_to_show

SHIPPED_UCI = pathlib.Path(REPO) / "packaging" / "files" / "openwrt" / "qinglong-edge.uci"

# A realistic dump: named and unnamed sections, a list, a quote and spaces in paths.
REALISTIC = """\
qinglong-edge.main=agent
qinglong-edge.main.enabled='1'
qinglong-edge.main.profile='edge'
qinglong-edge.main.state_directory='/etc/qinglong-edge/state'
qinglong-edge.worker=worker
qinglong-edge.worker.enabled='1'
qinglong-edge.worker.origin='https://cluster.example:7443'
qinglong-edge.worker.worker_id='router-1.lab'
qinglong-edge.worker.credential_file='/etc/qinglong-edge/bob'\\''s worker.credential'
qinglong-edge.worker.certificate_file='/etc/qinglong-edge/worker.crt'
qinglong-edge.worker.private_key_file='/etc/qinglong-edge/worker.key'
qinglong-edge.worker.trust_anchor_file='/etc/qinglong-edge/ca one.pem' '/etc/qinglong-edge/ca-2.pem'
qinglong-edge.worker.request_timeout_ms='20000'
qinglong-edge.worker.splay_max_ms='0'
qinglong-edge.worker.journal_directory=''
qinglong-edge.@local_api[0]=local_api
qinglong-edge.@local_api[0].enabled='on'
qinglong-edge.@local_api[0].host='127.0.0.1'
qinglong-edge.@local_api[0].port='5700'
qinglong-edge.@local_api[0].busy_timeout_ms='2500'
qinglong-edge.execution=execution
qinglong-edge.execution.enabled='yes'
qinglong-edge.execution.log_directory='/tmp/qinglong-edge/logs'
qinglong-edge.execution.cgroups='off'
qinglong-edge.execution.max_log_bytes='65536'
"""

EXPECTED = {
    "schema": "qinglong/edge-agent@v1",
    "profile": "edge",
    "stateDirectory": "/etc/qinglong-edge/state",
    "worker": {
        "origin": "https://cluster.example:7443",
        "workerId": "router-1.lab",
        "credentialFile": "/etc/qinglong-edge/bob's worker.credential",
        "certificateFile": "/etc/qinglong-edge/worker.crt",
        "privateKeyFile": "/etc/qinglong-edge/worker.key",
        "trustAnchorFiles": ["/etc/qinglong-edge/ca one.pem", "/etc/qinglong-edge/ca-2.pem"],
        "requestTimeoutMs": 20000,
        "splayMaxMs": 0,
    },
    "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}, "busyTimeoutMs": 2500},
    "execution": {"logDirectory": "/tmp/qinglong-edge/logs", "cgroups": "off", "maxLogBytes": 65536},
}


def test_realistic_dump_renders_to_a_config_the_agent_loads(tmp_path: pathlib.Path) -> None:
    dump = tmp_path / "uci.txt"
    dump.write_text(REALISTIC)
    out = tmp_path / "config.json"
    result = run_cli("config", "render-uci", "--input", str(dump), "--output", str(out))
    assert result.status == 0, result.stderr
    assert result.stdout == ""
    assert json.loads(out.read_text()) == EXPECTED
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "uci.txt"]  # no temp file left
    config = load_config(str(out))
    assert config.worker is not None and config.worker.trust_anchor_files[0] == "/etc/qinglong-edge/ca one.pem"
    assert config.local_api is not None and config.local_api.busy_timeout_ms == 2500


def test_without_output_prints_the_document(tmp_path: pathlib.Path) -> None:
    dump = tmp_path / "uci.txt"
    dump.write_text(REALISTIC)
    result = run_cli("config", "render-uci", "--input", str(dump))
    assert result.status == 0, result.stderr
    assert json.loads(result.stdout) == EXPECTED


def test_without_output_in_json_mode_prints_one_line(tmp_path: pathlib.Path) -> None:
    dump = tmp_path / "uci.txt"
    dump.write_text(REALISTIC)
    result = run_cli("config", "render-uci", "--input", str(dump), "--json")
    assert result.status == 0, result.stderr
    assert result.json() == {"ok": True, "config": EXPECTED}


def test_reads_stdin(tmp_path: pathlib.Path) -> None:
    result = run_cli("config", "render-uci", "--input", "-", input_bytes=REALISTIC.encode())
    assert result.status == 0, result.stderr
    assert json.loads(result.stdout) == EXPECTED


def test_runs_uci_show_when_no_input_is_given(tmp_path: pathlib.Path) -> None:
    dump = tmp_path / "uci.txt"
    dump.write_text(REALISTIC)
    bin_dir = tmp_path / "bin"
    install_fake_uci(bin_dir, UCI_PACKAGE, dump)
    result = run_cli("config", "render-uci", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.status == 0, result.stderr
    assert json.loads(result.stdout) == EXPECTED


def test_rejects_failing_uci_show(tmp_path: pathlib.Path) -> None:
    bin_dir = tmp_path / "bin"
    install_fake_uci(bin_dir, "another-package", tmp_path / "none")
    result = run_cli("config", "render-uci", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.status == 78
    assert "`uci -q show qinglong-edge` exited 1" in result.stderr


def test_rejects_missing_uci_command(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = run_cli("config", "render-uci", env={"PATH": str(empty)})
    assert result.status == 78
    assert "uci: command not found" in result.stderr


def _replace(dump: str, old: str, new: str) -> str:
    assert old in dump, old
    return dump.replace(old, new)


W = "qinglong-edge.worker"
L = "qinglong-edge.@local_api[0]"

BAD = [
    ("timeout_range", _replace(REALISTIC, "'20000'", "'999'"), f"{W}.request_timeout_ms: must be an integer from 1000 to 60000"),
    ("timeout_not_integer", _replace(REALISTIC, "'20000'", "'20s'"), f"{W}.request_timeout_ms: must be a decimal integer"),
    ("timeout_negative", _replace(REALISTIC, "'20000'", "'-1'"), f"{W}.request_timeout_ms: must be a decimal integer"),
    ("unknown_option", REALISTIC + f"{W}.colour='blue'\n", f"{W}.colour: unknown option"),
    ("unknown_section", REALISTIC + "qinglong-edge.extra=proxy\n", "qinglong-edge.extra: unknown section type 'proxy'"),
    ("second_section", REALISTIC + "qinglong-edge.w2=worker\n", "qinglong-edge.w2: a second 'worker' section"),
    ("bad_flag", _replace(REALISTIC, "execution.enabled='yes'", "execution.enabled='maybe'"),
     "qinglong-edge.execution.enabled: must be 0 or 1"),
    ("list_for_option", _replace(REALISTIC, "origin='https://cluster.example:7443'", "origin='https://a.example' 'https://b.example'"),
     f"{W}.origin: must be a single value"),
    ("missing_required", _replace(REALISTIC, "origin='https://cluster.example:7443'", "origin=''"), f"{W}.origin: is required"),
    ("plain_http", _replace(REALISTIC, "https://cluster.example:7443", "http://cluster.example"), f"{W}.origin:"),
    ("relative_state", _replace(REALISTIC, "'/etc/qinglong-edge/state'", "'state'"),
     "qinglong-edge.main.state_directory: must be an absolute path"),
    ("relative_anchor", _replace(REALISTIC, "'/etc/qinglong-edge/ca-2.pem'", "'ca-2.pem'"),
     f"{W}.trust_anchor_file: must be an absolute path"),
    ("bad_worker_id", _replace(REALISTIC, "'router-1.lab'", "'-router'"), f"{W}.worker_id: must be a worker id"),
    ("non_loopback", _replace(REALISTIC, "host='127.0.0.1'", "host='0.0.0.0'"), f"{L}.host: must be 127.0.0.1 or ::1"),
    ("missing_port", _replace(REALISTIC, "port='5700'", "port=''"), f"{L}.port: is required"),
    ("privileged_port", _replace(REALISTIC, "port='5700'", "port='80'"), f"{L}.port: must be an integer from 1024 to 65535"),
    ("bad_cgroups", _replace(REALISTIC, "cgroups='off'", "cgroups='on'"), "qinglong-edge.execution.cgroups: must be one of auto, off"),
    ("bad_profile", _replace(REALISTIC, "profile='edge'", "profile='router'"), "qinglong-edge.main.profile: must be one of"),
    ("service_without_local_api", _replace(REALISTIC, "enabled='on'", "enabled='0'"), f"{L}.enabled: must be 1 when the service is enabled"),
    ("execution_without_local_api",
     _replace(_replace(REALISTIC, "enabled='on'", "enabled='0'"), "main.enabled='1'", "main.enabled='0'"),
     f"{L}.enabled: must be 1 when execution is enabled"),
    ("no_agent_section", "qinglong-edge.worker=worker\n", "qinglong-edge.@agent[0].state_directory: is required"),
    ("unquoted_value", REALISTIC + "qinglong-edge.main.profile2=edge\n", "qinglong-edge.main.profile2: every value must be single-quoted"),
    ("other_package", "network.lan=interface\n", "line 1: not a line of package 'qinglong-edge'"),
]


@pytest.mark.parametrize(("dump", "message"), [pytest.param(d, m, id=i) for i, d, m in BAD])
def test_rejects_invalid_uci_naming_the_option(tmp_path: pathlib.Path, dump: str, message: str) -> None:
    source = tmp_path / "uci.txt"
    source.write_text(dump)
    out = tmp_path / "config.json"
    out.write_text("previous")
    result = run_cli("config", "render-uci", "--input", str(source), "--output", str(out))
    assert result.status == 78, result.stderr
    assert result.stderr.startswith(f"qinglong-edge: invalid_configuration: {message}"), result.stderr
    assert "Traceback" not in result.stderr
    assert out.read_text() == "previous"  # the old config is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "uci.txt"]


def test_rejects_invalid_uci_in_json_mode(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "uci.txt"
    source.write_text(_replace(REALISTIC, "'20000'", "'999'"))
    result = run_cli("config", "render-uci", "--input", str(source), "--json")
    assert result.status == 78
    body = result.json()
    assert body["code"] == "invalid_configuration"
    assert body["message"].startswith(f"{W}.request_timeout_ms:")


def test_rejects_non_utf8_dump(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "uci.txt"
    source.write_bytes(b"qinglong-edge.main=agent\nqinglong-edge.main.profile='\xff'\n")
    result = run_cli("config", "render-uci", "--input", str(source))
    assert result.status == 78
    assert "not UTF-8" in result.stderr


def test_unwritable_output_is_a_storage_error(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "uci.txt"
    source.write_text(REALISTIC)
    result = run_cli("config", "render-uci", "--input", str(source), "--output", str(tmp_path / "missing" / "c.json"))
    assert result.status == 74
    assert "storage_unavailable" in result.stderr


def test_disabled_roles_are_not_rendered_but_their_option_names_are_checked() -> None:
    dump = _replace(REALISTIC, "worker.enabled='1'", "worker.enabled='0'")
    document = json.loads(render_uci_text(dump))
    assert "worker" not in document
    with pytest.raises(ConfigError) as info:
        render_uci_text(dump + f"{W}.colour='x'\n")
    assert info.value.path == f"{W}.colour"


# ---- the shipped defaults -------------------------------------------------------

def test_shipped_defaults_render_with_everything_off() -> None:
    show = uci_file_to_show(SHIPPED_UCI.read_text(), UCI_PACKAGE)
    document = json.loads(render_uci_text(show))
    assert document == {"schema": "qinglong/edge-agent@v1", "profile": "edge",
                        "stateDirectory": "/etc/qinglong-edge/state"}


def test_shipped_defaults_render_once_the_operator_fills_them_in() -> None:
    text = SHIPPED_UCI.read_text()
    for old, new in (("option enabled '0'", "option enabled '1'"),
                     ("option origin ''", "option origin 'https://cluster.example'"),
                     ("option worker_id ''", "option worker_id 'edge-1'")):
        text = text.replace(old, new)
    config = parse_config(json.loads(render_uci_text(uci_file_to_show(text, UCI_PACKAGE))))
    assert config.worker is not None and config.local_api is not None and config.execution is not None
    assert config.execution.log_directory == "/tmp/qinglong-edge/logs"  # RAM, never flash
    assert config.execution.work_directory == "/tmp/qinglong-edge/work"  # RAM too
    assert config.worker.runtime_directory == "/var/run/qinglong-edge"  # RAM: idle pulls never write to flash
    assert config.local_api.listener.port == 5700


# ---- the mapping covers the JSON schema ---------------------------------------------

def _config_keys() -> set[str]:
    """Every key config.py reads (the first argument of integer/choice/string/path_value/section/_get)."""
    tree = ast.parse((pathlib.Path(REPO) / "qinglong_edge" / "config.py").read_text())
    keys = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"integer", "choice", "string", "path_value", "section", "_get"}
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.add(node.args[0].value)
    return keys


def test_every_config_key_has_a_uci_option() -> None:
    mapped = {"schema"} | {kind.json_key for kind in UCI_SCHEMA if kind.json_key}
    for kind in UCI_SCHEMA:
        for option in kind.options:
            mapped.update(option.json_path)
    missing = _config_keys() - mapped
    assert not missing, f"config.py keys without a UCI option in commands/config.py UCI_SCHEMA: {sorted(missing)}"
    assert "requestTimeoutMs" in _config_keys()  # the scan itself finds keys


# ---- property: JSON -> UCI -> JSON --------------------------------------------------

_paths = st.from_regex(r"/[A-Za-z0-9 '._-]{1,30}", fullmatch=True)


@st.composite
def _documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": "qinglong/edge-agent@v1", "stateDirectory": draw(_paths)}
    if draw(st.booleans()):
        doc["profile"] = draw(st.sampled_from(["edge", "standalone"]))
    if draw(st.booleans()):
        worker: dict[str, Any] = {
            "origin": draw(st.sampled_from(["https://cluster.example", "https://10.0.0.1:7443", "https://[::1]:8443"])),
            "workerId": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)),
            "credentialFile": draw(_paths), "certificateFile": draw(_paths), "privateKeyFile": draw(_paths),
            "trustAnchorFiles": draw(st.lists(_paths, min_size=1, max_size=8)),
        }
        if draw(st.booleans()):
            worker["requestTimeoutMs"] = draw(st.integers(1000, 60000))
        if draw(st.booleans()):
            worker["inboxRetentionMs"] = draw(st.integers(60_000, 31_536_000_000))
        doc["worker"] = worker
    if draw(st.booleans()):
        doc["localApi"] = {"listener": {"host": draw(st.sampled_from(["127.0.0.1", "::1"])),
                                        "port": draw(st.integers(1024, 65535))}}
        if draw(st.booleans()):
            doc["execution"] = {"terminateGraceMs": draw(st.integers(1, 30000)),
                                "logDirectory": draw(_paths)}
    return doc


def _to_uci(doc: dict[str, Any]) -> str:
    """The UCI sections an operator would write for ``doc`` (inverse of UCI_SCHEMA)."""
    sections = []
    for kind in UCI_SCHEMA:
        source = doc if kind.json_key is None else doc.get(kind.json_key)
        options: dict[str, tuple[str, ...]] = {}
        if kind.json_key is None:
            options["enabled"] = ("1" if "localApi" in doc else "0",)
        else:
            options["enabled"] = ("1" if source is not None else "0",)
        for option in kind.options:
            value: Any = source
            for key in option.json_path:
                value = value.get(key) if isinstance(value, dict) else None
            if option.kind == "flag" or value is None:
                continue
            options[option.name] = tuple(value) if option.kind == "list" else (str(value),)
        sections.append(UciSection(kind.type, kind.type, options))
    return format_show(UCI_PACKAGE, sections)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(_documents())
def test_json_to_uci_to_json_round_trip(doc: dict[str, Any]) -> None:
    rendered = json.loads(render_uci_text(_to_uci(doc)))
    assert rendered == doc


def test_render_imports_nothing_heavy(tmp_path: pathlib.Path) -> None:
    """Rendering from a file needs neither ssl, sqlite3, sockets nor subprocess (spec README, layer 5)."""
    import subprocess
    import sys

    dump = tmp_path / "uci.txt"
    dump.write_text(REALISTIC)
    probe = (
        "import sys\nfrom qinglong_edge.cli import main\nstatus = main(sys.argv[1:])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'ssl', '_ssl', 'sqlite3', '_sqlite3', 'socket', 'http', 'subprocess'})\n"
        "print(heavy, file=sys.stderr)\nsys.exit(status)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", probe, "config", "render-uci", "--input", str(dump),
                           "--output", str(tmp_path / "c.json")], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]"
