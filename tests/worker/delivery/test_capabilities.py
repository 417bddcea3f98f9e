"""worker/delivery/capabilities.py: the probes, their per-boot cache, the job cgroup's limit."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from qinglong_edge.config import parse_config
from qinglong_edge.contracts.capabilities import parse_capabilities_file, python_semver
from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.worker.delivery import capabilities as caps_module
from qinglong_edge.worker.delivery.capabilities import CACHE_NAME, _limit_files, advertisement, probe
from qinglong_edge.worker.delivery.session import local_capabilities
from qinglong_edge.worker.journal.runtime import RuntimeDirectory

MOUNTINFO = """\
24 30 0:22 / /sys rw - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
"""


def _worker(tmp_path: pathlib.Path, **extra: object) -> object:
    doc = {"schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path / "state"),
           "worker": {"origin": "https://cluster.example:7443", "workerId": "edge-1", "credentialFile": "/c",
                      "certificateFile": "/c", "privateKeyFile": "/c", "trustAnchorFiles": ["/c"],
                      "logDirectory": str(tmp_path / "logs"), **extra}}
    return parse_config(doc).worker


def test_limit_files_walk_from_the_jobs_parent_up_to_the_root() -> None:
    cgroup = "0::/system.slice/qle.service\n5:memory:/system.slice/qle.service\n4:pids:/x\n"
    assert _limit_files(cgroup, MOUNTINFO) == [
        "/sys/fs/cgroup/unified/system.slice/qle.service/qinglong-edge/memory.max",
        "/sys/fs/cgroup/unified/system.slice/qle.service/memory.max",
        "/sys/fs/cgroup/unified/system.slice/memory.max",
        "/sys/fs/cgroup/memory/system.slice/qle.service/qinglong-edge/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/system.slice/qle.service/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/system.slice/memory.limit_in_bytes",
    ]
    assert _limit_files("0::/\n", MOUNTINFO) == ["/sys/fs/cgroup/unified/qinglong-edge/memory.max"]
    assert _limit_files("0::/../x\n", MOUNTINFO) == []  # never outside the hierarchy


def test_the_lowest_limit_below_mem_total_is_advertised(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files = [tmp_path / "a.max", tmp_path / "b.max", tmp_path / "c.max"]
    for path, text in zip(files, ("max\n", "268435456\n", "9223372036854771712\n"), strict=True):
        path.write_text(text)
    monkeypatch.setattr(caps_module, "_boot_facts", lambda runtime: (1 << 30, [str(p) for p in files]))
    found = probe(_worker(tmp_path))  # type: ignore[arg-type]
    assert (found.memory_bytes, found.memory_source) == (268435456, "cgroup limit")
    files[1].write_text("max\n")
    assert probe(_worker(tmp_path)).memory_source == "MemTotal"  # type: ignore[arg-type]


def test_disk_is_the_work_directorys_file_system_or_its_nearest_parent(tmp_path: pathlib.Path) -> None:
    found = probe(_worker(tmp_path))  # type: ignore[arg-type]
    st = os.statvfs(tmp_path)
    assert found.disk_path == str(tmp_path) and found.disk_bytes == st.f_blocks * st.f_frsize


def test_the_boot_facts_are_cached_per_boot_and_cgroup(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    calls: list[str] = []
    real = caps_module._mem_total
    monkeypatch.setattr(caps_module, "_mem_total", lambda: calls.append("meminfo") or real())
    with RuntimeDirectory.open(str(tmp_path / "run"), str(tmp_path / "journal")) as runtime:
        first = probe(_worker(tmp_path), runtime)  # type: ignore[arg-type]
        cached = json.loads(runtime.read(CACHE_NAME) or b"{}")
        assert cached["bootId"] and cached["cgroup"] == pathlib.Path("/proc/self/cgroup").read_text()
        again = probe(_worker(tmp_path), runtime)  # type: ignore[arg-type]
        assert calls == ["meminfo"] and again.memory_bytes == first.memory_bytes
        runtime.write(CACHE_NAME, json.dumps({**cached, "bootId": "another-boot"}).encode())
        probe(_worker(tmp_path), runtime)  # type: ignore[arg-type]
        assert calls == ["meminfo", "meminfo"]


def test_the_same_device_gives_the_same_hash_and_labels_change_it(tmp_path: pathlib.Path) -> None:
    base = local_capabilities()
    one = advertisement(_worker(tmp_path), base)  # type: ignore[arg-type]
    two = advertisement(_worker(tmp_path), base)  # type: ignore[arg-type]
    labelled = advertisement(_worker(tmp_path, labels={"site": "lab"}), base)  # type: ignore[arg-type]
    assert one.hash == two.hash != labelled.hash
    assert labelled.capabilities["labels"] == {"site": "lab"}


@pytest.mark.parametrize(("info", "text"), [
    ((3, 11, 2, "final", 0), "3.11.2"), ((3, 13, 0, "candidate", 1), "3.13.0-rc.1"),
    ((3, 14, 0, "alpha", 3), "3.14.0-alpha.3"), ((3, 12, 0, "beta", 2), "3.12.0-beta.2"),
])
def test_python_versions_map_to_semver(info: tuple[object, ...], text: str) -> None:
    assert python_semver(info) == text


def test_the_file_rules_name_the_key() -> None:
    good = {"architecture": "arm64", "executors": ["remote-worker"], "protocolVersion": "1.0.0",
            "supportTier": "tier1"}
    assert parse_capabilities_file(json.dumps(good).encode(), architecture="arm64") == good
    for document, code, path in (({**good, "supportTier": "candidate"}, "support_tier", "$.supportTier"),
                                 ({**good, "protocolVersion": "9007199254740992.0.0"}, "semver", "$.protocolVersion"),
                                 ({**good, "extra": 1}, "key_set", "$.extra")):
        with pytest.raises(ContractError) as caught:
            parse_capabilities_file(json.dumps(document).encode(), architecture="arm64")
        assert (caught.value.code, caught.value.path) == (code, path)
