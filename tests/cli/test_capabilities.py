"""What the device advertises, end to end against the TLS cluster double (which places by
the reference's rules): the operator's capabilities file or the probes, the hash that
changes only with them, a change that waits for the records in flight, and bad files.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

from qinglong_edge.contracts.placement import canonical_capabilities
from tests.support.cluster_double import ClusterDouble
from tests.support.remote_env import RemoteEnv, dump
from tests.support.wait import wait_until

FILE_CAPS: dict[str, Any] = {
    "architecture": "amd64", "executors": ["remote-worker"], "protocolVersion": "1.0.0", "supportTier": "tier1",
    "operatingSystem": "linux", "runtimes": [{"name": "node", "version": "20.11.1"}],
    "labels": {"site": "lab", "zone": "b"}, "capacity": {"cpuCores": 2, "memoryBytes": 2 << 30},
    "features": ["gpio"],
}


@pytest.fixture
def env(tmp_path: pathlib.Path, cluster: ClusterDouble) -> RemoteEnv:
    if os.uname().machine != "x86_64":
        pytest.skip("the files below advertise amd64")
    return RemoteEnv(tmp_path, cluster)


def _file(env: RemoteEnv, content: bytes | dict[str, Any], mode: int = 0o644) -> pathlib.Path:
    path = env.root / "capabilities.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    path.chmod(mode)
    return path


def _registered(cluster: ClusterDouble) -> list[dict[str, Any]]:
    return [json.loads(e.json()["capabilitiesJson"]) for e in cluster.exchanges_for("register")]


def _claimed_score(env: RemoteEnv) -> int:
    return int(env.record()["offer"]["placementScore"])


def test_the_file_is_the_whole_advertisement_and_the_cluster_places_by_it(env: RemoteEnv) -> None:
    env.write_config(capabilitiesFile=str(_file(env, FILE_CAPS)))
    env.quick_job("job", placement={
        "required": {"labels": {"site": "lab"}, "runtimes": [{"name": "node", "versionRange": "^20.10"}],
                     "minMemoryBytes": 1 << 30, "features": ["gpio"], "operatingSystems": ["linux"]},
        "preferred": [{"labels": {"zone": "b"}, "weight": 7}, {"labels": {"zone": "c"}, "weight": 50}]})
    outcome = env.run_to_end()
    assert outcome.status == 0, dump(outcome)
    assert env.starts("job") == 1 and _claimed_score(env) == 7
    assert _registered(env.cluster) == [canonical_capabilities(FILE_CAPS)[0]]


def test_the_file_overrides_the_probes(env: RemoteEnv) -> None:
    env.write_config(capabilitiesFile=str(_file(env, FILE_CAPS)))
    env.cluster.add_command_task("echo python", placement={"required": {"runtimes": [{"name": "python"}]}})
    first = env.pull("--json")
    assert first.status == 0 and first.cycles()[-1]["reason"] == "no_match", dump(first)  # no probed python
    assert _registered(env.cluster) == [canonical_capabilities(FILE_CAPS)[0]]


def test_the_probes_advertise_os_python_memory_disk_cores_and_labels(env: RemoteEnv) -> None:
    env.write_config(labels={"site": "lab"})
    env.quick_job("job", placement={
        "required": {"operatingSystems": ["linux"], "runtimes": [{"name": "python", "versionRange": ">=3.9"}],
                     "minMemoryBytes": 16 << 20, "minDiskBytes": 1 << 20, "labels": {"site": "lab"}},
        "preferred": [{"labels": {"site": "lab"}, "weight": 3}]})
    outcome = env.run_to_end()
    assert outcome.status == 0 and env.starts("job") == 1, dump(outcome)
    assert _claimed_score(env) == 3
    (caps,) = _registered(env.cluster)
    assert caps["operatingSystem"] == "linux" and caps["labels"] == {"site": "lab"}
    assert caps["runtimes"] == [{"name": "python",
                                 "version": "{}.{}.{}".format(*os.sys.version_info[:3])}]  # type: ignore[attr-defined]
    assert set(caps["capacity"]) == {"cpuCores", "memoryBytes", "diskBytes"}
    assert caps["capacity"]["cpuCores"] == len(os.sched_getaffinity(0))
    env.cluster.add_command_task("echo big", placement={"required": {"minMemoryBytes": 2**52}})
    assert env.pull("--json").cycles()[-1]["reason"] == "no_match"


def test_the_hash_changes_only_when_the_capabilities_change(env: RemoteEnv) -> None:
    for _ in range(3):
        assert env.pull().status == 0
    assert len(env.cluster.exchanges_for("register")) == 1  # the same probes: the same hash
    env.write_config(labels={"site": "lab"})
    changed = env.pull("--json")
    assert changed.cycles()[-1]["session"]["action"] == "registered", dump(changed)
    assert changed.cycles()[-1]["session"]["detail"] == "capabilities_changed"
    assert env.pull("--json").cycles()[-1]["session"]["action"] in ("current", "heartbeat")
    assert len(env.cluster.exchanges_for("register")) == 2


def test_a_change_waits_until_no_record_is_in_flight(env: RemoteEnv) -> None:
    """A re-registration replaces the session and fences its leases: with a job running
    the device keeps the old session (no new work under it) and registers once it is done."""
    task = env.gated_job("job")
    resident = env.spawn_json()
    env.wait_state("running_acknowledged")
    env.stop(resident)  # the job goes on; the next pull re-adopts it
    env.write_config(labels={"site": "moved"})
    env.cluster.add_command_task("echo later")
    again = env.spawn_json()
    assert wait_until(lambda: env.cluster.exchanges_for("lease-control"), timeout=20)
    assert len(env.cluster.exchanges_for("register")) == 1
    env.release("job")
    outcome = env.finish(again, timeout=60)
    assert outcome.status == 0, dump(outcome)
    assert outcome.cycles()[0]["status"] == "no_slot" and outcome.cycles()[0]["reason"] == "capabilities_changed"
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"  # its lease was never fenced
    registers = [i for i, e in enumerate(env.cluster.exchanges) if e.op == "register"]
    completion = next(i for i, e in enumerate(env.cluster.exchanges) if e.op == "completion")
    assert len(registers) == 2 and registers[1] > completion
    assert _registered(env.cluster)[1]["labels"] == {"site": "moved"}
    assert env.cluster.fence_reasons() == []
    assert len(env.cluster.state.candidates) == 1  # nothing claimed under the old advertisement


def _big() -> dict[str, Any]:
    """Within 20 KiB as a file, over 16 KiB as the canonical advertisement."""
    return {**FILE_CAPS, "labels": {f"k{i:03d}" + "x" * 120: "v" * 256 for i in range(32)},
            "runtimes": [{"name": f"r{i:02d}" + "x" * 61, "version": "1.0.0-" + "p" * 58} for i in range(32)]}


BAD: dict[str, tuple[Any, int, str]] = {
    "too_large": (b"{" + b" " * 20480 + b"}", 0o644, "outside 2..20480"),
    "writable_by_others": (FILE_CAPS, 0o666, "writable by group or others"),
    "writable_by_group": (FILE_CAPS, 0o664, "writable by group or others"),
    "not_utf8": (b'{"architecture":"\xff"}', 0o644, "is not UTF-8"),
    "not_json": (b"{architecture: amd64}", 0o644, "is not strict JSON"),
    "duplicate_key": (b'{"architecture":"amd64","architecture":"amd64"}', 0o644, "duplicate_key"),
    "unknown_key": ({**FILE_CAPS, "colour": "red"}, 0o644, "$.colour: unknown key"),
    "missing_key": ({k: v for k, v in FILE_CAPS.items() if k != "protocolVersion"}, 0o644,
                    "$.protocolVersion: missing key"),
    "other_architecture": ({**FILE_CAPS, "architecture": "arm64"}, 0o644,
                           "$.architecture: 'arm64' is not this device's architecture (amd64)"),
    "no_remote_worker": ({**FILE_CAPS, "executors": ["shell"]}, 0o644, "$.executors: must contain"),
    "over_16_kib": (_big(), 0o644, "over 16384"),
    "bad_label": ({**FILE_CAPS, "labels": {"bad key": "x"}}, 0o644, '$.labels["bad key"]'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_file_is_one_line_exit_78_and_no_claim(env: RemoteEnv, case: str) -> None:
    content, mode, words = BAD[case]
    path = _file(env, content, mode)
    env.write_config(capabilitiesFile=str(path))
    env.cluster.add_command_task("echo never")
    result = env.pull()
    assert result.status == 78, dump(result)
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("qinglong-edge: invalid_capabilities: "), line
    assert f"{path} (worker.capabilitiesFile)" in line and words in line, line
    assert env.cluster.exchanges == []  # no register, no offer call: nothing claimed
    assert env.inbox() == {} and env.claim() is None


def test_a_symlinked_file_is_refused(env: RemoteEnv) -> None:
    target = _file(env, FILE_CAPS)
    link = env.root / "link.json"
    link.symlink_to(target)
    env.write_config(capabilitiesFile=str(link))
    result = env.pull()
    assert result.status == 78 and "is a symlink" in result.stderr and str(link) in result.stderr, dump(result)
    assert env.cluster.exchanges == []


def test_a_bad_file_found_while_a_pull_is_resident_keeps_the_last_good_advertisement(env: RemoteEnv) -> None:
    path = _file(env, FILE_CAPS)
    env.write_config(capabilitiesFile=str(path))
    task = env.gated_job("job")
    resident = env.spawn_json()
    env.wait_state("running_acknowledged")
    path.write_bytes(b"{broken")
    cron = env.pull()
    assert cron.status == 78, dump(cron)
    assert "keeps advertising the capabilities it started with" in cron.stderr and str(path) in cron.stderr
    env.release("job")
    outcome = env.finish(resident, timeout=60)
    assert outcome.status == 0, dump(outcome)
    assert env.cluster.completion(task.candidate["runId"])["status"] == "succeeded"
    assert _registered(env.cluster) == [canonical_capabilities(FILE_CAPS)[0]]  # never re-registered
