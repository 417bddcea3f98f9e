"""``qinglong-edge offer check``: the real CLI in a child process, on vector A and I1-I10."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.contracts import vector_a as va
from tests.support.cli import run_cli

CLAIM = va.VECTORS / "a_pending_claim.json"


def write(tmp_path: pathlib.Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_vector_a_offered_is_valid() -> None:
    result = run_cli("offer", "check", "--claim", str(CLAIM), str(va.VECTORS / "a_offered.json"))
    assert (result.status, result.stdout, result.stderr) == (0, "valid offered offer-1 run-1\n", "")


def test_vector_a_idle_is_valid_in_json() -> None:
    result = run_cli("offer", "check", "--claim", str(CLAIM), str(va.VECTORS / "a_idle.json"), "--json")
    assert result.status == 0
    assert result.json() == {"ok": True, "verdict": "valid", "status": "idle", "reason": "no_candidates"}


@pytest.mark.parametrize("variant", va.INVALID_VARIANTS, ids=lambda v: v.name)
def test_invalid_variant_is_reported(tmp_path: pathlib.Path, variant: va.Variant) -> None:
    response = write(tmp_path, f"{variant.name}.json", variant.body)
    result = run_cli("offer", "check", "--claim", str(CLAIM), response)
    assert result.status == 65
    assert result.stdout == f"invalid {variant.code} {variant.path}\n"
    assert "Traceback" not in result.stderr
    assert va.LEASE_TOKEN not in result.stdout + result.stderr


def test_invalid_verdict_in_json(tmp_path: pathlib.Path) -> None:
    i9 = next(v for v in va.INVALID_VARIANTS if v.name == "I9")
    result = run_cli("offer", "check", "--json", "--claim", str(CLAIM), write(tmp_path, "r.json", i9.body))
    assert result.status == 65
    assert result.json() == {"ok": False, "verdict": "invalid", "code": "stats_range", "path": "$.stats.claimRaces"}


def test_needs_no_configuration(tmp_path: pathlib.Path) -> None:
    result = run_cli("offer", "check", "--claim", str(CLAIM), str(va.VECTORS / "a_idle.json"),
                     env={"QINGLONG_EDGE_CONFIG": str(tmp_path / "missing.json")})
    assert result.status == 0, result.stderr


def test_unreadable_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    result = run_cli("offer", "check", "--claim", str(tmp_path / "nope.json"), str(va.VECTORS / "a_idle.json"))
    assert result.status == 66
    assert result.stdout == ""
    assert result.stderr.startswith("qinglong-edge: input_unreadable: cannot read the claim file")
    assert "Traceback" not in result.stderr
    result = run_cli("offer", "check", "--claim", str(CLAIM), str(tmp_path))
    assert result.status == 66
    assert "response file" in result.stderr


def test_invalid_claim_is_not_a_response_verdict(tmp_path: pathlib.Path) -> None:
    claim = json.loads(va.PENDING_CLAIM)
    claim["attemptCount"] = 99
    result = run_cli("offer", "check", "--claim", write(tmp_path, "c.json", va.compact(claim)),
                     str(va.VECTORS / "a_offered.json"))
    assert result.status == 65
    assert result.stdout == ""
    assert result.stderr.startswith("qinglong-edge: claim_conflict: $.attemptCount")
    assert va.LEASE_TOKEN not in result.stderr


def test_oversize_response_is_invalid_without_reading_it_all(tmp_path: pathlib.Path) -> None:
    response = write(tmp_path, "big.json", b"{" + b" " * 300_000 + b"}")
    result = run_cli("offer", "check", "--claim", str(CLAIM), response)
    assert (result.status, result.stdout) == (65, "invalid too_large $\n")


def test_missing_action_and_arguments_are_usage_errors() -> None:
    assert run_cli("offer").status == 64
    assert run_cli("offer", "check", str(va.VECTORS / "a_idle.json")).status == 64
    help_text = run_cli("offer", "check", "--help")
    assert help_text.status == 0
    assert "--claim" in help_text.stdout


def test_offer_check_imports_no_heavy_module() -> None:
    import subprocess
    import sys

    from tests.cli.test_lazy_imports import HEAVY, PROBE
    from tests.support.cli import REPO

    proc = subprocess.run(
        [sys.executable, "-I", "-c", PROBE.format(heavy=set(HEAVY)), "offer", "check", "--claim", str(CLAIM),
         str(va.VECTORS / "a_offered.json")],
        capture_output=True, cwd=REPO, check=False, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    assert json.loads(line[len("HEAVY="):]) == []
