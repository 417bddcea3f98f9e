"""What a remote job must not see, from the configuration (spec README, "Isolation")."""

from __future__ import annotations

import json
import os
import pathlib
import sys

from qinglong_edge.config import DEFAULT_RUNTIME_DIRECTORY, load_config
from qinglong_edge.worker.remote.isolation import (
    CGROUP_ROOT,
    agent_code_paths,
    remote_hidden_paths,
    remote_readonly_paths,
)


def _config(tmp_path: pathlib.Path, device: pathlib.Path, **extra: object) -> pathlib.Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path / "state"),
        "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1",
                   "credentialFile": str(device / "credential"), "certificateFile": str(device / "client.pem"),
                   "privateKeyFile": str(device / "client.key"), "trustAnchorFiles": [str(tmp_path / "ca.pem")],
                   "journalDirectory": str(tmp_path / "journal")},
        **extra,
    }))
    return path


def test_a_private_credential_directory_is_hidden_whole(tmp_path: pathlib.Path) -> None:
    device = tmp_path / "device"
    device.mkdir(mode=0o700)
    paths = remote_hidden_paths(load_config(str(_config(tmp_path, device))))
    assert paths == tuple(sorted({CGROUP_ROOT, str(device), str(tmp_path / "state"), str(tmp_path / "journal"),
                                  DEFAULT_RUNTIME_DIRECTORY}))  # the runtime directory too (issue 24)
    assert str(tmp_path / "ca.pem") not in paths  # a trust anchor is public


def test_a_shared_directory_hides_only_the_secret_files(tmp_path: pathlib.Path) -> None:
    device = tmp_path / "etc"
    device.mkdir(mode=0o755)  # like /etc: hiding it would break the job
    config = load_config(str(_config(tmp_path, device, localApi={"listener": {"host": "127.0.0.1", "port": 5700}},
                                     execution={})))
    paths = remote_hidden_paths(config)
    assert str(device) not in paths
    assert {str(device / "credential"), str(device / "client.key")} <= set(paths)
    assert str(device / "client.pem") not in paths
    assert config.local_api is not None and config.execution is not None
    assert config.local_api.pepper_keyring_directory in paths and config.execution.log_directory in paths
    assert config.execution.work_directory in paths  # the Local Runs' HOME (issue 24)


def test_what_the_agent_reads_back_and_its_user_could_change_is_read_only(tmp_path: pathlib.Path) -> None:
    """Issue 24 item 1: the configuration, the certificate outside the key's private
    directory and the trust anchors stay visible to an isolated job, read-only when the
    agent's user could change them; what is hidden is not listed twice; a file of root's
    in a directory of root's is left to the file permissions."""
    device = tmp_path / "etc"
    device.mkdir(mode=0o755)
    for name in ("credential", "client.key", "client.pem"):
        (device / name).write_text(name)
    (tmp_path / "ca.pem").write_text("anchor")
    config_path = _config(tmp_path, device)
    config = load_config(str(config_path))
    readonly = remote_readonly_paths(config)
    for path in (config_path, device / "client.pem", tmp_path / "ca.pem"):
        assert str(path) in readonly, path  # the test runs as their owner: they could be changed
    assert not set(readonly) & set(remote_hidden_paths(config))
    assert str(device / "client.key") not in readonly
    assert set(agent_code_paths()) >= {os.path.dirname(os.path.abspath(sys.executable))}
    # Root's /etc/hostname in root's /etc: an unprivileged agent could not change it.
    if os.geteuid() != 0:
        document = json.loads(config_path.read_text())
        document["worker"]["trustAnchorFiles"] = ["/etc/hostname"]
        config_path.write_text(json.dumps(document))
        assert "/etc/hostname" not in remote_readonly_paths(load_config(str(config_path)))
