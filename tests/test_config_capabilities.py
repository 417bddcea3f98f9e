"""The worker keys of issue 25: capabilitiesFile, labels, drainTimeoutMs (JSON and UCI)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from qinglong_edge.commands.config import render_uci_text
from qinglong_edge.config import parse_config
from qinglong_edge.errors import ConfigError

WORKER = {"origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
          "certificateFile": "/c", "privateKeyFile": "/c", "trustAnchorFiles": ["/c"]}
DUMP = ("qinglong-edge.main=agent\nqinglong-edge.main.state_directory='/var/lib/qe'\n"
        "qinglong-edge.worker=worker\nqinglong-edge.worker.enabled='1'\n"
        "qinglong-edge.worker.origin='https://cluster.example:7443'\nqinglong-edge.worker.worker_id='edge-1'\n"
        "qinglong-edge.worker.credential_file='/c'\nqinglong-edge.worker.certificate_file='/c'\n"
        "qinglong-edge.worker.private_key_file='/c'\nqinglong-edge.worker.trust_anchor_file='/c'\n")


def _parse(profile: str = "edge", **worker: Any) -> Any:
    return parse_config({"schema": "qinglong/edge-agent@v1", "profile": profile, "stateDirectory": "/s",
                         "worker": {**WORKER, **worker}}).worker


def test_defaults() -> None:
    worker = _parse()
    assert (worker.capabilities_file, worker.labels, worker.drain_timeout_ms) == (None, (), 60_000)
    assert _parse("standalone").drain_timeout_ms == 300_000  # the reference's node profile


def test_values() -> None:
    worker = _parse(capabilitiesFile="/etc/qinglong-edge/capabilities.json", drainTimeoutMs=1000)
    assert (worker.capabilities_file, worker.drain_timeout_ms) == ("/etc/qinglong-edge/capabilities.json", 1000)
    assert _parse(labels={"site": "lab", "zone": "b"}).labels == (("site", "lab"), ("zone", "b"))


@pytest.mark.parametrize(("worker", "path"), [
    ({"capabilitiesFile": "relative.json"}, "$.worker.capabilitiesFile"),
    ({"drainTimeoutMs": 999}, "$.worker.drainTimeoutMs"),
    ({"drainTimeoutMs": 600_001}, "$.worker.drainTimeoutMs"),
    ({"labels": ["site=lab"]}, "$.worker.labels"),
    ({"labels": {"bad key": "x"}}, '$.worker.labels["bad key"]'),
    ({"labels": {"site": ""}}, "$.worker.labels.site"),
    ({"labels": {f"k{i}": "v" for i in range(33)}}, "$.worker.labels"),
    ({"labels": {"site": "lab"}, "capabilitiesFile": "/etc/c.json"}, "$.worker.labels"),
])
def test_rejects(worker: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(**worker)
    assert caught.value.path == path, caught.value.message


def test_uci_labels_are_a_list_of_key_value() -> None:
    dump = DUMP + ("qinglong-edge.worker.label='site=lab' 'owner/team=a=b'\n"
                   "qinglong-edge.worker.capabilities_file=''\nqinglong-edge.worker.drain_timeout_ms='30000'\n")
    document = json.loads(render_uci_text(dump))
    assert document["worker"]["labels"] == {"site": "lab", "owner/team": "a=b"}
    assert document["worker"]["drainTimeoutMs"] == 30000 and "capabilitiesFile" not in document["worker"]
    with_file = json.loads(render_uci_text(DUMP + "qinglong-edge.worker.capabilities_file='/etc/c.json'\n"))
    assert with_file["worker"]["capabilitiesFile"] == "/etc/c.json"


@pytest.mark.parametrize(("items", "words"), [
    ("'site'", "'site' is not key=value"),
    ("'=lab'", "'=lab' is not key=value"),
    ("'site=a' 'site=b'", "the key 'site' is given twice"),
    ("'bad key=x'", "does not match the grammar"),
])
def test_uci_label_errors_name_the_option(items: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        render_uci_text(DUMP + f"qinglong-edge.worker.label={items}\n")
    assert caught.value.message.startswith("qinglong-edge.worker.label: ") and words in caught.value.message
