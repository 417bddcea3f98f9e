"""Execution revision normalization and digest (offer-delivery.md 2.4, Appendix A)."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.execution_revision import (
    DIGEST_PREFIX,
    MAX_REVISION_BYTES,
    create_secret_ref,
    icu_sort_key,
    normalize_execution_revision,
    parse_secret_ref,
    revision_content_digest,
)
from qinglong_edge.contracts.strictjson import dumps
from tests.contracts import vector_a as va


def vector_revision() -> dict[str, Any]:
    return va.offered()["offer"]["executionRevision"]


def build(**changes: Any) -> dict[str, Any]:
    """Vector A's revision with ``changes``, without a digest (verify_digest=False builds it)."""
    value = vector_revision()
    del value["contentDigest"]
    value.update(changes)
    return value


def rejects(value: dict[str, Any], code: str, path: str | None = None) -> None:
    with pytest.raises(ContractError) as info:
        normalize_execution_revision(value, verify_digest=False)
    assert info.value.code == code, (info.value.code, info.value.path)
    if path is not None:
        assert info.value.path == path


def secret(name: str, project: str = "project-1", version: int | None = None) -> str:
    return create_secret_ref(project, name, version)


# --- vector A and the digest -------------------------------------------------------------------------


def test_vector_a_digest() -> None:
    normalized = normalize_execution_revision(vector_revision())
    assert normalized["contentDigest"] == va.CONTENT_DIGEST
    assert revision_content_digest(normalized) == va.CONTENT_DIGEST
    immutable = {k: v for k, v in normalized.items() if k not in ("createdAtMs", "contentDigest")}
    assert dumps(immutable).encode() == va.IMMUTABLE
    assert hashlib.sha256(DIGEST_PREFIX + va.IMMUTABLE).hexdigest() == va.CONTENT_DIGEST


def test_output_is_in_canonical_key_order() -> None:
    value = build(
        timeoutMs=5, placement={}, workingDirectory="/srv",
        environmentBundleRef=secret("bundle", version=3),
    )
    shuffled = dict(reversed(list(value.items())))
    normalized = normalize_execution_revision(shuffled, verify_digest=False)
    assert list(normalized) == [
        "projectId", "taskId", "taskRevision", "sourceRevision", "sourceContentDigest", "executorType",
        "planSchema", "command", "environment", "environmentBundleRef", "workingDirectory", "timeoutMs",
        "placement", "createdAtMs", "contentDigest",
    ]
    assert normalized["placement"] == {"required": {"executors": ["remote-worker"]}}


def test_rejects_a_received_digest_that_does_not_match() -> None:
    value = vector_revision()
    value["createdAtMs"] = 2  # not hashed: still valid
    assert normalize_execution_revision(value)["contentDigest"] == va.CONTENT_DIGEST
    value["taskId"] = "task-2"
    with pytest.raises(ContractError) as info:
        normalize_execution_revision(value)
    assert (info.value.code, info.value.path) == ("digest_mismatch", "$.executionRevision.contentDigest")


def test_requires_the_content_digest_when_verifying() -> None:
    with pytest.raises(ContractError) as info:
        normalize_execution_revision(build())
    assert (info.value.code, info.value.path) == ("key_set", "$.executionRevision.contentDigest")


# --- ICU ordering of the environment -----------------------------------------------------------------


CANONICAL_ENV = [
    {"name": "api_key", "kind": "public", "value": "k"},
    {"name": "API_URL", "kind": "public", "value": "https://x"},
    {"name": "HOME", "kind": "public", "value": "/root"},
]


def test_icu_key_orders_api_key_api_url_home() -> None:
    assert sorted(["HOME", "API_URL", "api_key"], key=icu_sort_key) == ["api_key", "API_URL", "HOME"]
    assert sorted(["HOME", "API_URL", "api_key"]) == ["API_URL", "HOME", "api_key"]


@pytest.mark.parametrize(
    "ordered",
    [
        ["_", "-", ":", ".", "/", "+", "0", "9", "a", "A", "b", "B", "z", "Z"],
        ["a", "a_b", "a-b", "a0", "aa", "aB", "Ab", "ab0", "b"],
        ["a", "A", "aa", "aA", "Aa", "AA"],
        ["x1", "x10", "x2"],
        ["node", "Node_X", "node.js", "nodejs"],
        ["ab", "abc", "AbC", "ABc"],
    ],
)
def test_icu_key_matches_appendix_a(ordered: list[str]) -> None:
    for seed in range(5):
        shuffled = ordered[:]
        random.Random(seed).shuffle(shuffled)
        assert sorted(shuffled, key=icu_sort_key) == ordered


def test_icu_key_is_total_on_odd_characters() -> None:
    assert icu_sort_key("İ") != icu_sort_key("I")
    assert sorted(["ß", "İ", "a"], key=icu_sort_key)


def test_out_of_order_environment_has_the_canonical_digest() -> None:
    canonical = normalize_execution_revision(build(environment=CANONICAL_ENV), verify_digest=False)
    received = build(environment=list(reversed(CANONICAL_ENV)), contentDigest=canonical["contentDigest"])
    normalized = normalize_execution_revision(received)
    assert normalized["contentDigest"] == canonical["contentDigest"]
    assert [b["name"] for b in normalized["environment"]] == ["api_key", "API_URL", "HOME"]


def test_code_point_order_would_give_another_digest() -> None:
    canonical = normalize_execution_revision(build(environment=CANONICAL_ENV), verify_digest=False)
    code_point = {k: v for k, v in canonical.items() if k not in ("createdAtMs", "contentDigest")}
    code_point["environment"] = sorted(CANONICAL_ENV, key=lambda b: b["name"])
    assert revision_content_digest(code_point) != canonical["contentDigest"]


# --- command --------------------------------------------------------------------------------------------


def test_unknown_command_and_binding_keys_are_dropped() -> None:
    plain = normalize_execution_revision(build(environment=CANONICAL_ENV), verify_digest=False)
    env = [{**b, "comment": "x"} for b in CANONICAL_ENV]
    noisy = normalize_execution_revision(
        build(command={"kind": "argv", "file": "/usr/bin/node", "args": ["job.js"], "cwd": "/x"}, environment=env),
        verify_digest=False,
    )
    assert noisy == plain


def test_shell_command_with_and_without_shell() -> None:
    a = normalize_execution_revision(build(command={"kind": "shell", "command": "echo hi"}), verify_digest=False)
    b = normalize_execution_revision(build(command={"shell": "/bin/bash", "command": "echo hi", "kind": "shell"}),
                                     verify_digest=False)
    assert a["command"] == {"kind": "shell", "command": "echo hi"}
    assert b["command"] == {"kind": "shell", "command": "echo hi", "shell": "/bin/bash"}
    assert a["contentDigest"] != b["contentDigest"]


P = "$.executionRevision.command"


@pytest.mark.parametrize(
    ("command", "code", "path"),
    [
        ("argv", "not_object", P),
        ({"kind": "exec", "file": "/x", "args": []}, "command_kind", f"{P}.kind"),
        ({"file": "/x", "args": []}, "command_kind", f"{P}.kind"),
        ({"kind": "argv", "file": "node", "args": []}, "pattern", f"{P}.file"),
        ({"kind": "argv", "file": "", "args": []}, "length", f"{P}.file"),
        ({"kind": "argv", "file": "/a\x00b", "args": []}, "control_character", f"{P}.file"),
        ({"kind": "argv", "file": "/" + "a" * 4096, "args": []}, "length", f"{P}.file"),
        ({"kind": "argv", "file": "/x"}, "not_array", f"{P}.args"),
        ({"kind": "argv", "file": "/x", "args": ["a"] * 257}, "length", f"{P}.args"),
        ({"kind": "argv", "file": "/x", "args": [1]}, "not_string", f"{P}.args[0]"),
        ({"kind": "argv", "file": "/x", "args": ["ok", "n\x00ul"]}, "control_character", f"{P}.args[1]"),
        ({"kind": "argv", "file": "/x", "args": ["a" * 16385]}, "length", f"{P}.args[0]"),
        ({"kind": "argv", "file": "/x", "args": ["a" * 16384] * 4}, "budget", P),
        ({"kind": "shell", "command": ""}, "length", f"{P}.command"),
        ({"kind": "shell", "command": "a" * 65537}, "length", f"{P}.command"),
        ({"kind": "shell", "command": "ls", "shell": "/bin/zsh"}, "shell", f"{P}.shell"),
        ({"kind": "shell", "command": "ls", "shell": None}, "shell", f"{P}.shell"),
    ],
)
def test_rejects_an_invalid_command(command: object, code: str, path: str) -> None:
    rejects(build(command=command), code, path)


def test_accepts_command_limits() -> None:
    value = build(command={"kind": "argv", "file": "/x", "args": ["", "a" * 16384, "\n\t"] + ["b"] * 253})
    assert len(normalize_execution_revision(value, verify_digest=False)["command"]["args"]) == 256


# --- environment ------------------------------------------------------------------------------------------

E = "$.executionRevision.environment"


@pytest.mark.parametrize(
    ("environment", "code", "path"),
    [
        ({}, "not_array", E),
        ([{"name": "A", "kind": "public", "value": "v"}] * 257, "length", E),
        (["A=1"], "not_object", f"{E}[0]"),
        ([{"name": 1, "kind": "public", "value": "v"}], "not_string", f"{E}[0].name"),
        ([{"name": "1A", "kind": "public", "value": "v"}], "env_name", f"{E}[0].name"),
        ([{"name": "A-B", "kind": "public", "value": "v"}], "env_name", f"{E}[0].name"),
        ([{"name": "A" * 129, "kind": "public", "value": "v"}], "env_name", f"{E}[0].name"),
        ([{"name": "QL3_TOKEN", "kind": "public", "value": "v"}], "env_reserved", f"{E}[0].name"),
        ([{"name": "A", "kind": "public", "value": "v"}, {"name": "A", "kind": "public", "value": "w"}],
         "env_duplicate", f"{E}[1].name"),
        ([{"name": "A", "kind": "plain", "value": "v"}], "binding_kind", f"{E}[0].kind"),
        ([{"name": "A", "kind": "public"}], "not_string", f"{E}[0].value"),
        ([{"name": "A", "kind": "public", "value": "a\x00"}], "control_character", f"{E}[0].value"),
        ([{"name": "A", "kind": "secret", "secretRef": ""}], "length", f"{E}[0].secretRef"),
        ([{"name": "A", "kind": "secret", "secretRef": "vault:x"}], "secret_ref", f"{E}[0].secretRef"),
        ([{"name": "A", "kind": "secret", "secretRef": create_secret_ref("project-2", "s")}], "secret_ref_project",
         f"{E}[0].secretRef"),
        ([{"name": "A", "kind": "public", "value": "v" * 65536}], "budget", E),
    ],
)
def test_rejects_an_invalid_environment(environment: object, code: str, path: str) -> None:
    rejects(build(environment=environment), code, path)


def test_accepts_public_values_with_control_characters_and_secret_refs() -> None:
    env = [
        {"name": "B", "kind": "secret", "secretRef": secret("db", version=2)},
        {"name": "a", "kind": "public", "value": ""},
        {"name": "_X", "kind": "public", "value": "line1\nline2\t\x7f"},
    ]
    normalized = normalize_execution_revision(build(environment=env), verify_digest=False)
    assert [b["name"] for b in normalized["environment"]] == ["_X", "a", "B"]


# --- secret references ---------------------------------------------------------------------------------------


def test_secret_ref_round_trips() -> None:
    ref = create_secret_ref("project-1", "db", 7)
    assert ref.startswith("qlsecret:v1:")
    assert parse_secret_ref(ref) == {"projectId": "project-1", "name": "db", "version": 7}
    assert parse_secret_ref(create_secret_ref("p", "n")) == {"projectId": "p", "name": "n"}


def _ref(payload: bytes) -> str:
    import base64

    return "qlsecret:v1:" + base64.urlsafe_b64encode(payload).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "ref",
    [
        _ref(b'{"name":"db","projectId":"project-1"}'),  # key order
        _ref(b'{"projectId":"project-1", "name":"db"}'),  # whitespace
        _ref(b'{"projectId":"project-1","name":"db","extra":1}'),
        _ref(b'{"projectId":"project-1","name":"db","version":0}'),
        _ref(b'{"projectId":"project-1","name":"db","version":1.0}'),
        _ref(b'{"projectId":"project-1","name":"db","version":null}'),
        _ref(b'{"projectId":"project-1","name":""}'),
        _ref(b'{"projectId":"project-1","name":"a\\u0001"}'),
        _ref(b'["project-1","db"]'),
        _ref(b"\xff"),
        "qlsecret:v1:",
        "qlsecret:v1:a=",
        "qlsecret:v2:" + _ref(b'{"projectId":"p","name":"n"}')[12:],
        _ref(b'{"projectId":"p","name":"n"}') + "A",
        create_secret_ref("p", "n")[:-1] + chr(ord(create_secret_ref("p", "n")[-1]) + 1),  # non-canonical tail
    ],
)
def test_rejects_a_non_canonical_secret_ref(ref: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_secret_ref(ref)
    assert info.value.code == "secret_ref"


def test_rejects_a_secret_ref_over_512_bytes() -> None:
    with pytest.raises(ContractError):
        create_secret_ref("p" * 128, "n" * 128 + "é" * 200)
    assert len(create_secret_ref("p" * 128, "n" * 128, 2**31 - 1)) <= 512


def test_environment_bundle_ref_needs_a_version_and_the_same_project() -> None:
    ok = normalize_execution_revision(build(environmentBundleRef=secret("b", version=1)), verify_digest=False)
    assert ok["environmentBundleRef"] == secret("b", version=1)
    rejects(build(environmentBundleRef=secret("b")), "bundle_ref_version")
    rejects(build(environmentBundleRef=secret("b", "project-2", 1)), "secret_ref_project")
    rejects(build(environmentBundleRef="x"), "secret_ref")


# --- other fields ----------------------------------------------------------------------------------------------

R = "$.executionRevision"


@pytest.mark.parametrize(
    ("changes", "code", "path"),
    [
        ({"extra": 1}, "key_set", f"{R}.extra"),
        ({"projectId": ""}, "length", f"{R}.projectId"),
        ({"projectId": "é" * 65}, "length", f"{R}.projectId"),
        ({"taskId": "t\x7f"}, "control_character", f"{R}.taskId"),
        ({"sourceRevision": 0}, "out_of_range", f"{R}.sourceRevision"),
        ({"sourceRevision": 2**31}, "out_of_range", f"{R}.sourceRevision"),
        ({"sourceRevision": 1.0}, "not_integer", f"{R}.sourceRevision"),
        ({"sourceContentDigest": "A" * 64}, "pattern", f"{R}.sourceContentDigest"),
        ({"taskRevision": "qltd:v1:01:" + "a" * 64}, "task_revision_mismatch", f"{R}.taskRevision"),
        ({"executorType": "local_process"}, "executor_type", f"{R}.executorType"),
        ({"planSchema": "qinglong/command-execution@v2"}, "plan_schema", f"{R}.planSchema"),
        ({"workingDirectory": "srv"}, "pattern", f"{R}.workingDirectory"),
        ({"workingDirectory": "/a\x00"}, "control_character", f"{R}.workingDirectory"),
        ({"workingDirectory": "/" * 4097}, "length", f"{R}.workingDirectory"),
        ({"workingDirectory": None}, "not_string", f"{R}.workingDirectory"),
        ({"timeoutMs": 0}, "out_of_range", f"{R}.timeoutMs"),
        ({"timeoutMs": 31_536_000_001}, "out_of_range", f"{R}.timeoutMs"),
        ({"createdAtMs": -1}, "out_of_range", f"{R}.createdAtMs"),
        ({"placement": None}, "not_object", f"{R}.placement"),
    ],
)
def test_rejects_an_invalid_revision_field(changes: dict[str, Any], code: str, path: str) -> None:
    rejects(build(**changes), code, path)


def test_rejects_a_missing_required_key() -> None:
    value = build()
    del value["environment"]
    rejects(value, "key_set", f"{R}.environment")


def test_accepts_field_limits() -> None:
    value = build(projectId="é" * 64, timeoutMs=31_536_000_000, workingDirectory="/" * 4096, createdAtMs=2**53 - 1)
    value["taskRevision"] = "qltd:v1:1:" + "a" * 64
    normalized = normalize_execution_revision(value, verify_digest=False)
    assert normalized["timeoutMs"] == 31_536_000_000


def _sized(total: int) -> dict[str, Any]:
    """A revision whose serialization with createdAtMs (without contentDigest) is ``total`` bytes."""
    env = [{"name": "A", "kind": "public", "value": ""}]
    args = ["x" * 16000] * 4
    probe = normalize_execution_revision(build(environment=env, command={"kind": "argv", "file": "/x", "args": args}),
                                         verify_digest=False)
    base = len(dumps({k: v for k, v in probe.items() if k != "contentDigest"}).encode())
    env[0]["value"] = "v" * (total - base)
    return build(environment=env, command={"kind": "argv", "file": "/x", "args": args})


def test_revision_budget_counts_created_at_and_excludes_the_digest() -> None:
    at_limit = normalize_execution_revision(_sized(MAX_REVISION_BYTES), verify_digest=False)
    assert len(dumps({k: v for k, v in at_limit.items() if k != "contentDigest"}).encode()) == MAX_REVISION_BYTES
    rejects(_sized(MAX_REVISION_BYTES + 1), "budget", R)


def test_digest_changes_with_hashed_content_only() -> None:
    a = normalize_execution_revision(build(), verify_digest=False)
    b = normalize_execution_revision(build(createdAtMs=999), verify_digest=False)
    c = normalize_execution_revision(build(timeoutMs=1000), verify_digest=False)
    assert a["contentDigest"] == b["contentDigest"] != c["contentDigest"]


def test_digest_matches_json_stringify_of_the_immutable_part() -> None:
    value = build(environment=CANONICAL_ENV, placement={"preferred": [{"labels": {"zone": "é"}, "weight": 3}]})
    normalized = normalize_execution_revision(value, verify_digest=False)
    immutable = {k: v for k, v in normalized.items() if k not in ("createdAtMs", "contentDigest")}
    text = json.dumps(immutable, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(DIGEST_PREFIX + text.encode()).hexdigest() == normalized["contentDigest"]


def appendix_a_key(s: str) -> tuple[list[tuple[int, int]], list[int]]:
    """offer-delivery.md Appendix A, transcribed as printed (the verified reference)."""
    p = []
    t = []
    for c in s:
        if c in "_-:./+":
            p.append((0, "_-:./+".index(c)))
        elif c.isdigit():
            p.append((1, ord(c)))
        else:
            p.append((2, ord(c.lower())))
        t.append(1 if c.isupper() else 0)
    return (p, t)


@given(st.lists(st.text(alphabet="aAbBzZ019_-.:/+", max_size=8), min_size=2, max_size=8))
@settings(max_examples=300, deadline=None)
def test_icu_key_orders_exactly_like_appendix_a(names: list[str]) -> None:
    assert sorted(names, key=icu_sort_key) == sorted(names, key=appendix_a_key)
    for a, b in itertools.pairwise(names):
        assert (icu_sort_key(a) < icu_sort_key(b)) == (appendix_a_key(a) < appendix_a_key(b))


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="İ"), max_size=6), max_size=6))
@settings(max_examples=200, deadline=None)
def test_icu_key_agrees_with_appendix_a_on_any_text(names: list[str]) -> None:
    # Outside the contract alphabets the appendix is not ICU, but our key must still be it.
    assert sorted(names, key=icu_sort_key) == sorted(names, key=appendix_a_key)
