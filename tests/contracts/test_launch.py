"""Launch plan, environment rules, materialization and the environment bundle (section 4.1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qinglong_edge.contracts.launch import (
    MAX_ENVIRONMENT_BYTES,
    Environment,
    LaunchError,
    _launcher_rules,
    launch_plan,
    materialize_environment,
    parse_environment_bundle,
)
from qinglong_edge.contracts.secret_delivery import SecretValues
from tests.contracts import vector_rx as vr

BUNDLE_REF = vr.secret("BUNDLE", version=1)


def raw_offer(**revision: Any) -> dict[str, Any]:
    """The fixture offer with revision keys replaced *without* re-normalizing (launch re-checks)."""
    value = vr.offer()
    value["executionRevision"].update(revision)
    for key, new in list(revision.items()):
        if new is vr.DELETE:
            del value["executionRevision"][key]
    return value


def fails(call: Any, code: str, reason: str, path: str | None = None) -> LaunchError:
    with pytest.raises(LaunchError) as info:
        call()
    assert (info.value.code, info.value.reason) == (code, reason), (info.value.reason, info.value.path)
    if path is not None:
        assert info.value.path == path
    return info.value


def bundle(*entries: tuple[str, str], schema: str = "qinglong/environment-bundle@v1") -> bytearray:
    return bytearray(vr.body({"schema": schema, "entries": [{"name": n, "value": v} for n, v in entries]}))


def secrets(refs: tuple[str, ...] = (), values: tuple[str, ...] = (), bundles: tuple[bytearray, ...] = ()
            ) -> SecretValues:
    return SecretValues(refs, [bytearray(v, "utf-8") for v in values], (BUNDLE_REF,) if bundles else (),
                        list(bundles))


# --- launch plan ----------------------------------------------------------------------------------------------


def test_the_fixture_is_an_argv_launch() -> None:
    plan = launch_plan(vr.offer())
    assert (plan.kind, plan.argv, plan.working_directory, plan.timeout_ms) == (
        "argv", ("/usr/bin/node", "job.js"), None, None)
    assert (plan.run_id, plan.attempt_id) == ("run-1", "attempt-1")


def test_shell_launches() -> None:
    plan = launch_plan(vr.offer_with_revision(command={"kind": "shell", "command": "echo hi"}, timeoutMs=5000,
                                              workingDirectory="/srv/job"))
    assert (plan.kind, plan.argv, plan.working_directory, plan.timeout_ms) == (
        "shell", ("/bin/sh", "-c", "echo hi"), "/srv/job", 5000)
    bash = launch_plan(vr.offer_with_revision(command={"kind": "shell", "command": "x", "shell": "/bin/bash"}))
    assert bash.argv == ("/bin/bash", "-c", "x")


@pytest.mark.parametrize(
    ("command", "reason", "path"),
    [
        ({"kind": "argv", "file": "/usr/bin/node", "args": [""]}, "length", "$.offer.executionRevision.command.args[0]"),
        ({"kind": "argv", "file": "/", "args": []}, "pattern", "$.offer.executionRevision.command.file"),
        ({"kind": "argv", "file": "bin/node", "args": []}, "pattern", "$.offer.executionRevision.command.file"),
        ({"kind": "argv", "file": "/x\x00", "args": []}, "control_character", None),
        ({"kind": "argv", "file": "/" + "x" * 4096, "args": []}, "length", None),
        ({"kind": "argv", "file": "/x", "args": ["a"] * 257}, "length", "$.offer.executionRevision.command.args"),
        ({"kind": "argv", "file": "/x", "args": ["a" * 16385]}, "length", None),
        ({"kind": "argv", "file": "/x", "args": ["a" * 16384] * 4}, "budget", "$.offer.executionRevision.command"),
        ({"kind": "argv", "file": "/x", "args": "a"}, "not_array", None),
        ({"kind": "shell", "command": ""}, "length", None),
        ({"kind": "shell", "command": "x" * 65537}, "length", None),
        ({"kind": "shell", "command": "x", "shell": "/bin/zsh"}, "shell", "$.offer.executionRevision.command.shell"),
        ({"kind": "exec"}, "command_kind", "$.offer.executionRevision.command.kind"),
        ([], "not_object", "$.offer.executionRevision.command"),
    ],
)
def test_command_limits(command: Any, reason: str, path: str | None) -> None:
    fails(lambda: launch_plan(raw_offer(command=command)), "launch_invalid", reason, path)


def test_command_boundaries_that_pass() -> None:
    plan = launch_plan(raw_offer(command={"kind": "argv", "file": "/x", "args": ["a"] * 256}))
    assert len(plan.argv) == 257
    near = 64 * 1024 - 2 - 3 * 16384
    plan = launch_plan(raw_offer(command={"kind": "argv", "file": "/x", "args": ["a" * 16384] * 3 + ["b" * near]}))
    assert len(plan.argv[-1]) == near


def test_an_empty_argument_allowed_by_the_revision_is_refused_at_launch() -> None:
    offer = vr.offer_with_revision(command={"kind": "argv", "file": "/usr/bin/env", "args": [""]})  # G7
    fails(lambda: launch_plan(offer), "launch_invalid", "length")


@pytest.mark.parametrize(("directory", "reason"), [("/", "pattern"), ("srv", "pattern"), ("/a\x00", "control_character"),
                                                   ("/" + "d" * 4096, "length"), (7, "not_string")])
def test_working_directory(directory: Any, reason: str) -> None:
    fails(lambda: launch_plan(raw_offer(workingDirectory=directory)), "launch_invalid", reason,
          "$.offer.executionRevision.workingDirectory")


@pytest.mark.parametrize(("timeout", "reason"), [(0, "out_of_range"), (365 * 24 * 3600 * 1000 + 1, "out_of_range"),
                                                 (1.5, "not_integer")])
def test_timeout(timeout: Any, reason: str) -> None:
    fails(lambda: launch_plan(raw_offer(timeoutMs=timeout)), "launch_invalid", reason)


@pytest.mark.parametrize("run_id", ["r" * 37, "-run", "run 1", "run/1", ""])
def test_ids_must_be_portable(run_id: str) -> None:
    value = vr.offer()
    value["candidate"]["runId"] = run_id
    fails(lambda: launch_plan(value), "launch_invalid", "pattern", "$.offer.candidate.runId")


def test_plan_schema() -> None:
    fails(lambda: launch_plan(raw_offer(planSchema="qinglong/command-execution@v2")), "launch_invalid", "plan_schema")


# --- materialization ---------------------------------------------------------------------------------------------


def test_public_and_secret_bindings_in_revision_order() -> None:
    offer = vr.offer_with_revision(environment=[
        {"name": "ZED", "kind": "public", "value": "z"},
        {"name": "API_KEY", "kind": "secret", "secretRef": vr.API_KEY_REF},
        {"name": "alpha", "kind": "public", "value": "é"},
    ])
    environment = materialize_environment(offer, secrets((vr.API_KEY_REF,), ("s3cr3t",)))
    assert environment.names == [b["name"] for b in offer["executionRevision"]["environment"]]
    assert environment.environ() == {b"alpha": "é".encode(), b"API_KEY": b"s3cr3t", b"ZED": b"z"}
    assert "s3cr3t" not in repr(environment) and "s3cr3t" not in str(environment)
    held = environment.values[1]
    environment.wipe()
    assert held == bytearray(6) and len(environment) == 0


def test_no_environment() -> None:
    assert len(materialize_environment(vr.offer(), None)) == 0


def test_the_secrets_answer_is_copied_not_shared() -> None:
    answer = secrets((vr.API_KEY_REF,), ("s3cr3t",))
    environment = materialize_environment(vr.api_key_offer(), answer)
    answer.wipe()
    assert environment.environ() == {b"API_KEY": b"s3cr3t"}


def test_a_missing_secret_is_an_error() -> None:
    fails(lambda: materialize_environment(vr.api_key_offer(), None), "environment_invalid", "missing_secret",
          "$.offer.executionRevision.environment[0].secretRef")
    fails(lambda: materialize_environment(vr.api_key_offer(), secrets()), "environment_invalid", "missing_secret")


def test_an_empty_value_is_refused_by_the_launcher_rule() -> None:
    offer = vr.offer_with_revision(environment=[{"name": "EMPTY", "kind": "public", "value": ""}])
    fails(lambda: materialize_environment(offer, None), "environment_invalid", "env_value",
          "$.environment[0].value")
    fails(lambda: materialize_environment(vr.api_key_offer(), secrets((vr.API_KEY_REF,), ("",))),
          "environment_invalid", "env_value")


def test_a_secret_value_over_16_kib_is_refused() -> None:
    fails(lambda: materialize_environment(vr.api_key_offer(), secrets((vr.API_KEY_REF,), ("v" * 16385,))),
          "environment_invalid", "env_value")
    assert len(materialize_environment(vr.api_key_offer(), secrets((vr.API_KEY_REF,), ("v" * 16384,)))) == 1


def test_the_64_kib_budget_counts_secret_values() -> None:
    refs = tuple(vr.secret(f"S{i}") for i in range(4))
    offer = vr.offer_with_revision(environment=[{"name": f"V{i}", "kind": "secret", "secretRef": ref}
                                                for i, ref in enumerate(refs)])
    names = sum(len(f"V{i}") for i in range(4))
    fits = ("v" * 16384,) * 3 + ("v" * (MAX_ENVIRONMENT_BYTES - names - 3 * 16384),)
    assert len(materialize_environment(offer, secrets(refs, fits))) == 4
    over = (*fits[:3], fits[3] + "v")
    fails(lambda: materialize_environment(offer, secrets(refs, over)), "environment_invalid", "budget")


def test_bundles_are_appended_sorted() -> None:
    data = bundle(("ZETA", "1"), ("ALPHA", "2"))
    environment = materialize_environment(vr.api_key_offer(), secrets((vr.API_KEY_REF,), ("k",), (data,)))
    assert environment.names == ["API_KEY", "ALPHA", "ZETA"]
    assert environment.environ()[b"ALPHA"] == b"2"


def test_a_bundle_name_already_bound_is_an_error() -> None:
    data = bundle(("API_KEY", "other"))
    fails(lambda: materialize_environment(vr.api_key_offer(), secrets((vr.API_KEY_REF,), ("k",), (data,))),
          "environment_invalid", "env_duplicate", "$.environmentBundles[0]")


def test_bundle_entries_count_toward_256() -> None:
    bindings = [{"name": f"B{i:03d}", "kind": "public", "value": "v"} for i in range(200)]
    offer = vr.offer_with_revision(environment=bindings)
    ok = bundle(*((f"E{i:03d}", "v") for i in range(56)))
    assert len(materialize_environment(offer, secrets(bundles=(ok,)))) == 256
    over = bundle(*((f"E{i:03d}", "v") for i in range(57)))
    fails(lambda: materialize_environment(offer, secrets(bundles=(over,))), "environment_invalid", "budget")


def test_bundle_entries_count_toward_64_kib() -> None:
    # 3 + 16384 for the binding, 3 x (2 + 16384) for the bundle: 65 545 > 65 536 (each part fits on its own).
    offer = vr.offer_with_revision(environment=[{"name": "BIG", "kind": "public", "value": "v" * 16384}])
    data = bundle(*((f"E{i}", "v" * 16384) for i in range(3)))
    assert len(parse_environment_bundle(bytearray(data))) == 3
    fails(lambda: materialize_environment(offer, secrets(bundles=(data,))), "environment_invalid", "budget")


def test_a_bad_bundle_is_its_own_code() -> None:
    fails(lambda: materialize_environment(vr.offer(), secrets(bundles=(bytearray(b"{}"),))),
          "environment_bundle_invalid", "key_set")


def test_launcher_drops_receipt_and_launch_names_after_counting() -> None:
    names = ["KEEP", "QL3_RECEIPT_TOKEN", "QL3_LAUNCH_SHELL"]
    environment = _launcher_rules(names, [bytearray(b"1"), bytearray(b"2"), bytearray(b"3")])
    assert environment.names == ["KEEP"]
    with pytest.raises(Exception) as info:
        _launcher_rules(["QL3_RECEIPT_X"], [bytearray(b"")])
    assert getattr(info.value, "code", None) == "env_value"
    with pytest.raises(Exception) as info:
        _launcher_rules(["A"] * 257, [bytearray(b"1")] * 257)
    assert getattr(info.value, "code", None) == "budget"
    with pytest.raises(Exception) as info:
        _launcher_rules(["1BAD"], [bytearray(b"1")])
    assert getattr(info.value, "code", None) == "env_name"


def test_environment_bytes_and_wipe() -> None:
    environment = Environment(["A"], [bytearray(b"secret")])
    assert environment.environ() == {b"A": b"secret"}
    assert "secret" not in repr(environment)


# --- the bundle format ------------------------------------------------------------------------------------------


def test_a_bundle_parses_sorted_with_bytearray_values() -> None:
    entries = parse_environment_bundle(bundle(("b", "2"), ("A", "1"), ("_c", "")))
    assert [(name, bytes(value)) for name, value in entries] == [("A", b"1"), ("_c", b""), ("b", b"2")]
    assert all(isinstance(value, bytearray) for _, value in entries)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (bundle(("A", "1"), schema="qinglong/environment-bundle@v2"), "schema"),
        (bytearray(b'{"schema":"qinglong/environment-bundle@v1"}'), "key_set"),
        (bytearray(b'{"schema":"qinglong/environment-bundle@v1","entries":[],"x":1}'), "key_set"),
        (bundle(), "length"),
        (bundle(*((f"E{i}", "v") for i in range(257))), "length"),
        (bundle(("1A", "v")), "env_name"),
        (bundle(("QL3_X", "v")), "env_name"),
        (bundle(("A" * 129, "v")), "env_name"),
        (bundle(("A", "v"), ("A", "w")), "env_duplicate"),
        (bundle(("A", "a\x00b")), "env_value"),
        (bundle(("A", "v" * 16385)), "env_value"),
        (bundle(*((f"E{i}", "v" * 16384) for i in range(4))), "budget"),
        (bytearray(b"[]"), "not_object"),
        (bytearray(b"{"), "too_small"),
        (bytearray(b"x" * (96 * 1024 + 1)), "too_large"),
        (bytearray(b'{"schema":"qinglong/environment-bundle@v1","entries":[{"name":"A"}]}'), "key_set"),
    ],
)
def test_bundle_rules(data: bytearray, reason: str) -> None:
    error = fails(lambda: parse_environment_bundle(data), "environment_bundle_invalid", reason)
    assert "v" * 20 not in str(error)


def test_bundle_value_boundaries_pass() -> None:
    names = sum(len(f"E{i}") for i in range(4))
    entries = [(f"E{i}", "v" * 16384) for i in range(3)] + [("E3", "v" * (64 * 1024 - names - 3 * 16384))]
    assert len(parse_environment_bundle(bundle(*entries))) == 4


def test_a_peer_key_in_a_bundle_does_not_reach_the_error() -> None:
    data = bytearray(b'{"schema":"qinglong/environment-bundle@v1","entries":[{"name":"A","value":"1","s3cr3t":2}]}')
    error = fails(lambda: parse_environment_bundle(data), "environment_bundle_invalid", "key_set")
    assert error.path == "$.entries[0]"


# --- properties --------------------------------------------------------------------------------------------------

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.text(max_size=10)
    | st.sampled_from(["argv", "shell", "/bin/sh", "/usr/bin/x", "qinglong/environment-bundle@v1"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["kind", "file", "args", "command", "shell", "schema", "entries", "name", "value"]),
        children, max_size=5),
    max_leaves=20,
)


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bundle_bytes(data: bytes) -> None:
    vr.only_call_errors(lambda: parse_environment_bundle(bytearray(data)), "environment_bundle_invalid")


@SETTINGS
@given(json_values)
def test_arbitrary_values(value: Any) -> None:
    vr.only_call_errors(lambda: launch_plan(raw_offer(command=value)), "launch_invalid")
    vr.only_call_errors(lambda: launch_plan(value), "launch_invalid")
    vr.only_call_errors(lambda: parse_environment_bundle(bytearray(json.dumps(value).encode())),
                        "environment_bundle_invalid")
    vr.only_call_errors(lambda: materialize_environment(raw_offer(environment=value), None), "environment_invalid")
