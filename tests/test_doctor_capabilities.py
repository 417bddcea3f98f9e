"""``doctor`` prints what the device advertises and, for ``--placement``, whether the
reference's rules would place that task here (diagnostics only)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import PullEnv

CAPS = {"architecture": "amd64", "executors": ["remote-worker"], "protocolVersion": "1.0.0", "supportTier": "tier1",
        "operatingSystem": "linux", "runtimes": [{"name": "python", "version": "3.11.2"}],
        "labels": {"site": "lab"}, "capacity": {"cpuCores": 4, "memoryBytes": 536870912}}


@pytest.fixture
def env(tmp_path: pathlib.Path, shared_cluster: ClusterDouble) -> PullEnv:
    if os.uname().machine != "x86_64":
        pytest.skip("the file below advertises amd64")
    shared_cluster.reset()
    return PullEnv(tmp_path, shared_cluster)


def _with_file(env: PullEnv, content: bytes) -> pathlib.Path:
    path = env.root / "capabilities.json"
    path.write_bytes(content)
    path.chmod(0o644)
    env.write_config(capabilitiesFile=str(path))
    return path


def test_doctor_prints_the_file_it_advertises_and_judges_a_placement(env: PullEnv) -> None:
    path = _with_file(env, json.dumps(CAPS).encode())
    placement = json.dumps({"required": {"minMemoryBytes": 1 << 30, "labels": {"site": "lab"}},
                            "preferred": [{"labels": {"site": "lab"}, "weight": 5}]})
    human = env.cli("doctor", "--placement", placement)
    assert human.status == 0, human.stderr + human.stdout
    assert f"capabilities                 file {path}: amd64 (tier1); linux; python 3.11.2; 4 CPUs; memory 512.0 MiB;" \
        " labels site=lab; 252 bytes, hash " in human.stdout
    assert 'advertises: {"architecture":"amd64","executors":["remote-worker"],' in human.stdout
    assert "placement: would not be placed here: memory (score 5; diagnostics only" in human.stdout
    fits = env.cli("--json", "doctor", "--placement", '{"required":{"runtimes":[{"name":"python","versionRange":"3.x"}]}}')
    data = json.loads(fits.stdout)
    assert data["placement"] == {"matches": True, "score": 0, "mismatches": []}
    assert data["advertisement"]["source"] == "file" and data["advertisement"]["capabilities"]["labels"] == {"site": "lab"}


def test_doctor_shows_the_probes_without_a_file(env: PullEnv) -> None:
    env.write_config(labels={"site": "lab"})
    data = json.loads(env.cli("--json", "doctor").stdout)
    (check,) = [c for c in data["checks"] if c["name"] == "capabilities"]
    assert check["ok"] and check["detail"].startswith("probed: amd64 (tier1); linux; python ")
    assert "(MemTotal)" in check["detail"] or "(cgroup limit)" in check["detail"]
    assert data["advertisement"]["capabilities"]["operatingSystem"] == "linux"


def test_a_bad_file_fails_doctor_with_the_line_pull_exits_with(env: PullEnv) -> None:
    path = _with_file(env, b'{"architecture":"amd64"}')
    result = env.cli("doctor")
    assert result.status == 69
    (line,) = [x for x in result.stdout.splitlines() if " capabilities " in x]
    assert line.startswith("FAIL") and f"{path} (worker.capabilitiesFile): $.executors: missing key" in line


@pytest.mark.parametrize(("placement", "words"), [
    ("{not json", "--placement: not strict JSON"),
    ('{"required":{"runtimes":[{"name":"python","versionRange":"nope"}]}}',
     "--placement: $.placement.required.runtimes[0].versionRange: not a node-semver range"),
    ('{"required":{"executors":["shell"]}}', "--placement: $.placement.required.executors"),
])
def test_an_unreadable_placement_is_a_usage_error(env: PullEnv, placement: str, words: str) -> None:
    _with_file(env, json.dumps(CAPS).encode())
    result = env.cli("doctor", "--placement", placement)
    assert result.status == 64 and words in result.stderr, result.stderr
