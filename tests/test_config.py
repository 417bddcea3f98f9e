"""Configuration: strict schema, range checks, clear one-line errors (exit 78)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

from qinglong_edge.config import load_config, parse_config
from qinglong_edge.errors import ConfigError
from tests.support.cli import run_cli


def minimal(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": "qinglong/edge-agent@v1", "stateDirectory": "/var/lib/qe"}
    doc.update(extra)
    return doc


WORKER = {
    "origin": "https://cluster.example:7443",
    "workerId": "edge-1",
    "credentialFile": "/etc/qe/worker.credential",
    "certificateFile": "/etc/qe/client.pem",
    "privateKeyFile": "/etc/qe/client.key",
    "trustAnchorFiles": ["/etc/qe/ca.pem"],
}


LOCAL_API = {"listener": {"host": "127.0.0.1", "port": 5700}}


@pytest.mark.parametrize(
    ("profile", "execution", "expected"),
    [
        pytest.param("edge", {}, 16, id="edge_default"),
        pytest.param("standalone", {}, 28, id="standalone_default"),
        pytest.param("edge", {"maxRunPids": 0}, 0, id="zero_is_no_cap"),
        pytest.param("edge", {"maxRunPids": 1}, 1, id="lowest"),
        pytest.param("standalone", {"maxRunPids": 4_194_304}, 4_194_304, id="pid_max_limit"),
    ],
)
def test_max_run_pids(profile: str, execution: dict[str, Any], expected: int) -> None:
    config = parse_config(minimal(profile=profile, localApi=LOCAL_API, execution=execution))
    assert config.execution is not None
    assert config.execution.max_run_pids == expected


def test_minimal_config_disables_every_role() -> None:
    config = parse_config(minimal())
    assert config.profile == "edge"
    assert (config.worker, config.local_api, config.execution) == (None, None, None)


def test_defaults_follow_the_profile() -> None:
    edge = parse_config(minimal(worker=WORKER, localApi={"listener": {"host": "127.0.0.1", "port": 5700}}, execution={}))
    assert edge.worker is not None and edge.execution is not None and edge.local_api is not None
    assert edge.worker.inbox_maximum_entries == 64
    assert edge.worker.pull_interval_ms == 2000
    assert edge.worker.journal_directory == "/var/lib/qe/worker"
    assert edge.execution.max_concurrent_runs == 2
    assert edge.local_api.database_file == "/var/lib/qe/local.db"
    standalone = parse_config(minimal(profile="standalone", worker=WORKER))
    assert standalone.worker is not None
    assert standalone.worker.inbox_maximum_entries == 256
    assert standalone.worker.pull_interval_ms == 500
    assert edge.worker.origin.port == 7443 and edge.worker.origin.host == "cluster.example"


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        pytest.param(minimal(extra=1), "$.extra", id="unknown_key_top"),
        pytest.param(minimal(worker={**WORKER, "x": 1}), "$.worker.x", id="unknown_key_nested"),
        pytest.param(minimal(worker={**WORKER, "requestTimeoutMs": "15000"}), "$.worker.requestTimeoutMs", id="wrong_type"),
        pytest.param(minimal(worker={**WORKER, "requestTimeoutMs": True}), "$.worker.requestTimeoutMs", id="bool_is_not_int"),
        pytest.param(minimal(worker={**WORKER, "requestTimeoutMs": 15000.0}), "$.worker.requestTimeoutMs", id="float_is_not_int"),
        pytest.param(minimal(worker={**WORKER, "requestTimeoutMs": 999}), "$.worker.requestTimeoutMs", id="below_range"),
        pytest.param(minimal(worker={**WORKER, "inboxMaximumEntries": 1025}), "$.worker.inboxMaximumEntries", id="above_range"),
        pytest.param(minimal(stateDirectory="var/lib/qe"), "$.stateDirectory", id="relative_path"),
        pytest.param(minimal(worker={**WORKER, "trustAnchorFiles": []}), "$.worker.trustAnchorFiles", id="no_anchor"),
        pytest.param(minimal(worker={**WORKER, "trustAnchorFiles": ["rel.pem"]}), "$.worker.trustAnchorFiles[0]", id="relative_anchor"),
        pytest.param(minimal(worker={**WORKER, "origin": "http://cluster.example"}), "$.worker.origin", id="plain_http"),
        pytest.param(minimal(worker={**WORKER, "origin": "https://u:p@cluster.example"}), "$.worker.origin", id="userinfo"),
        pytest.param(minimal(worker={**WORKER, "origin": "https://cluster.example/x"}), "$.worker.origin", id="origin_path"),
        pytest.param(minimal(worker={**WORKER, "workerId": "-bad"}), "$.worker.workerId", id="worker_id_grammar"),
        pytest.param(minimal(profile="router"), "$.profile", id="profile_enum"),
        pytest.param(minimal(schema="qinglong/edge-agent@v2"), "$.schema", id="schema"),
        pytest.param(minimal(localApi={"listener": {"host": "0.0.0.0", "port": 5700}}), "$.localApi.listener.host", id="non_loopback"),
        pytest.param(minimal(localApi={"listener": {"host": "127.0.0.1", "port": 80}}), "$.localApi.listener.port", id="privileged_port"),
        pytest.param(minimal(localApi={"listener": {"host": "127.0.0.1"}}), "$.localApi.listener.port", id="missing_port"),
        pytest.param(minimal(execution={}), "$.execution", id="execution_without_local_api"),
        pytest.param(minimal(localApi=LOCAL_API, execution={"maxRunPids": -1}), "$.execution.maxRunPids",
                     id="max_run_pids_negative"),
        pytest.param(minimal(localApi=LOCAL_API, execution={"maxRunPids": 4_194_305}), "$.execution.maxRunPids",
                     id="max_run_pids_above_pid_max_limit"),
        pytest.param(minimal(localApi=LOCAL_API, execution={"maxRunPids": "24"}), "$.execution.maxRunPids",
                     id="max_run_pids_string"),
        pytest.param({"schema": "qinglong/edge-agent@v1"}, "$.stateDirectory", id="missing_required"),
        pytest.param([], "$", id="not_an_object"),
    ],
)
def test_rejects_invalid_document(doc: Any, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.path == path
    assert info.value.code == "invalid_configuration"
    assert path in str(info.value)


def _write(tmp_path: pathlib.Path, text: str | bytes) -> pathlib.Path:
    path = tmp_path / "config.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _assert_config_failure(args: list[str], needle: str, env: dict[str, str] | None = None) -> None:
    result = run_cli(*args, env=env)
    assert result.status == 78, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("qinglong-edge: invalid_configuration: ")
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param(json.dumps(minimal(bogus=1)), "$.bogus: unknown key", id="unknown_key"),
        pytest.param(json.dumps(minimal(worker={**WORKER, "requestTimeoutMs": []})), "$.worker.requestTimeoutMs", id="wrong_type"),
        pytest.param(json.dumps(minimal(worker={**WORKER, "requestTimeoutMs": 60001})), "from 1000 to 60000", id="out_of_range"),
        pytest.param(json.dumps(minimal(stateDirectory="state")), "$.stateDirectory: must be an absolute path", id="relative_path"),
        pytest.param('{"schema": "qinglong/edge-agent@v1", "stateDirectory": ', "invalid_json", id="invalid_json"),
        pytest.param('{"schema": "qinglong/edge-agent@v1", "stateDirectory": "/a", "stateDirectory": "/b"}', "$.stateDirectory: duplicate_key", id="duplicate_key"),
        pytest.param('{"schema": "qinglong/edge-agent@v1", "stateDirectory": "/a", "x": NaN}', "non_finite_number", id="nan"),
    ],
)
def test_cli_reports_bad_config_in_one_line(tmp_path: pathlib.Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    _assert_config_failure(["--config", str(path), "doctor"], needle)


def test_cli_missing_file(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.json"
    _assert_config_failure(["doctor", "--config", str(missing)], f"{missing}: no such file")


def test_cli_env_variable_is_used(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "from-env.json"
    _assert_config_failure(["doctor"], str(missing), env={"QINGLONG_EDGE_CONFIG": str(missing)})


def test_cli_unreadable_directory_as_file(tmp_path: pathlib.Path) -> None:
    _assert_config_failure(["--config", str(tmp_path), "doctor"], "cannot read")


def test_cli_a_fifo_as_the_config_file_fails_at_once(tmp_path: pathlib.Path) -> None:
    """Regression (issue 27): a FIFO at the config path (a mistaken ``mkfifo``, a
    process substitution gone) blocked ``open`` for good: every cron pull hung, one more
    each minute, with nothing said. Like every file the worker reads, it is refused."""
    path = tmp_path / "config.json"
    os.mkfifo(path)
    _assert_config_failure(["--config", str(path), "pull"], f"{path}: not a regular file")


def test_cli_an_empty_config_option_names_no_file(tmp_path: pathlib.Path) -> None:
    """Regression (issue 27 break-it): ``--config "$CFG"`` with ``CFG`` unset fell back to
    $QINGLONG_EDGE_CONFIG or /etc/qinglong-edge/config.json, so a script meant for a test
    configuration ran against the device's own. An empty option is refused; an empty
    variable still means unset (the shell's convention)."""
    other = tmp_path / "from-env.json"
    _assert_config_failure(["--config", "", "doctor"], "--config is empty",
                           env={"QINGLONG_EDGE_CONFIG": str(other)})
    _assert_config_failure(["--config=", "pull"], "--config is empty")
    _assert_config_failure(["--config", str(other), "doctor"], f"{other}: no such file",
                           env={"QINGLONG_EDGE_CONFIG": ""})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_cli_unreadable_file_for_the_agent_user(tmp_path: pathlib.Path) -> None:
    import subprocess

    from tests.support.cli import REPO, unprivileged_python

    path = _write(tmp_path, json.dumps(minimal()))
    path.chmod(0o600)
    tmp_path.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=REPO)
    python = unprivileged_python()
    # A checkout below a 0700 directory (a clone in /root, or in a mktemp -d) cannot be
    # imported by uid 65534 at all: that is not the behaviour under test.
    probe = subprocess.run([python, "-c", "import qinglong_edge"], capture_output=True, env=env, user=65534,
                           group=65534, check=False, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot import qinglong_edge from {REPO} (a parent directory is private)")
    proc = subprocess.run(
        [python, "-m", "qinglong_edge", "--config", str(path), "doctor"],
        capture_output=True, text=True, env=env, user=65534, group=65534, check=False,
        cwd="/",
    )
    assert proc.returncode == 78, proc.stderr
    assert "cannot open (Permission denied)" in proc.stderr


def test_oversize_config_is_rejected(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, b" " * (64 * 1024 + 1))
    with pytest.raises(ConfigError, match="too_large"):
        load_config(str(path))


@pytest.mark.parametrize("value", ["16", "0"], ids=["cap", "zero_is_no_cap"])
def test_max_run_pids_from_uci(value: str) -> None:
    from qinglong_edge.commands.config import render_uci_text

    dump = (
        "qinglong-edge.main=agent\nqinglong-edge.main.enabled='1'\n"
        "qinglong-edge.main.state_directory='/var/lib/qe'\n"
        "qinglong-edge.api=local_api\nqinglong-edge.api.enabled='1'\nqinglong-edge.api.host='127.0.0.1'\n"
        "qinglong-edge.api.port='5700'\n"
        "qinglong-edge.execution=execution\nqinglong-edge.execution.enabled='1'\n"
        f"qinglong-edge.execution.max_run_pids='{value}'\n"
    )
    document = json.loads(render_uci_text(dump))
    assert document["execution"]["maxRunPids"] == int(value)
    config = parse_config(document)
    assert config.execution is not None and config.execution.max_run_pids == int(value)


@pytest.mark.parametrize(("execution", "needed"), [
    pytest.param({"maxTotalLogBytes": 1_048_576}, 2 * 1_048_576, id="edge-defaults-1-MiB-total"),
    pytest.param({"maxLogBytes": 8_388_608, "maxConcurrentRuns": 1}, 8_388_608, id="one-log-over-the-4-MiB-default"),
    pytest.param({"maxLogBytes": 1_048_576, "maxConcurrentRuns": 8, "maxTotalLogBytes": 4_194_304}, 8_388_608,
                 id="eight-runs"),
])
def test_a_total_log_cap_the_runs_in_flight_could_exceed_is_rejected(execution: dict[str, Any], needed: int) -> None:
    """Review: maxTotalLogBytes below maxLogBytes x maxConcurrentRuns cannot be met (logs
    of Runs in flight are never pruned); it was accepted. Now a clear error naming the
    JSON path, what it must be at least, and why."""
    with pytest.raises(ConfigError) as caught:
        parse_config(minimal(localApi=LOCAL_API, execution=execution))
    assert caught.value.path == "$.execution.maxTotalLogBytes"
    message = caught.value.message
    assert message.startswith("$.execution.maxTotalLogBytes: ") and f"at least {needed}" in message, message
    assert "maxLogBytes" in message and "maxConcurrentRuns" in message, message


def test_a_total_log_cap_equal_to_the_runs_in_flight_is_accepted() -> None:
    config = parse_config(minimal(localApi=LOCAL_API, execution={
        "maxLogBytes": 1_048_576, "maxConcurrentRuns": 4, "maxTotalLogBytes": 4_194_304}))
    assert config.execution is not None and config.execution.max_total_log_bytes == 4_194_304


def test_render_uci_names_the_uci_option_of_the_total_log_cap() -> None:
    from qinglong_edge.commands.config import render_uci_text

    show = ("qinglong-edge.main=agent\nqinglong-edge.main.state_directory='/var/lib/qe'\n"
            "qinglong-edge.local_api=local_api\nqinglong-edge.local_api.enabled='1'\n"
            "qinglong-edge.local_api.host='127.0.0.1'\nqinglong-edge.local_api.port='5700'\n"
            "qinglong-edge.execution=execution\nqinglong-edge.execution.enabled='1'\n"
            "qinglong-edge.execution.max_total_log_bytes='1048576'\n")
    with pytest.raises(ConfigError) as caught:
        render_uci_text(show)
    assert caught.value.message.startswith("qinglong-edge.execution.max_total_log_bytes: must be at least 2097152")
