"""What a remote job must not see, from the configuration (spec README, "Isolation")."""

from __future__ import annotations

import json
import pathlib

from qinglong_edge.config import load_config
from qinglong_edge.worker.job_isolation import CGROUP_ROOT, remote_hidden_paths


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
    assert paths == tuple(sorted({CGROUP_ROOT, str(device), str(tmp_path / "state"), str(tmp_path / "journal")}))
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
