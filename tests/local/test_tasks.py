"""Local task definitions and revisions on a real store."""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.errors import StoreError
from qinglong_edge.local.identity import Subject
from qinglong_edge.local.store import Store
from qinglong_edge.local.tasks import (
    TaskNotFound,
    canonical_definition,
    content_digest,
    create_task,
    get_task,
    list_tasks,
    normalize_definition,
    parse_revision_ref,
    read_task,
    resolve_revision_ref,
    revision_ref,
    set_task_status,
)

ADMIN = Subject("system", "admin")
ARGV = {"command": {"kind": "argv", "file": "/bin/sh", "args": ["-c", "echo hi"]}}


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Iterator[Store]:
    opened = Store.open(str(tmp_path / "local.db"))
    yield opened
    opened.close()


def _create(store: Store, definition: object = ARGV, *, mutation: str = "m1", name: str = "Nightly",
            task_id: str = "nightly") -> Any:
    return store.run(lambda c: create_task(c, project_id="default", task_id=task_id, name=name,
                                           definition=definition, mutation_id=mutation, created_by=ADMIN, now_ms=100))


def test_canonical_form_and_digest() -> None:
    definition = normalize_definition({
        "timeoutMs": 5000,
        "environment": [{"value": "2", "name": "B"}, {"name": "A", "value": "1"}],
        "command": {"args": ["x"], "file": "run", "kind": "argv"},
        "workingDirectory": "/tmp",
    })
    text = canonical_definition(definition)
    assert text == (
        '{"command":{"args":["x"],"file":"run","kind":"argv"},'
        '"environment":[{"name":"A","value":"1"},{"name":"B","value":"2"}],'
        '"timeoutMs":5000,"workingDirectory":"/tmp"}'
    )
    assert content_digest(definition) == hashlib.sha256(text.encode()).hexdigest()


def test_shell_definition_defaults() -> None:
    assert normalize_definition({"command": {"kind": "shell", "command": "echo hi"}}) == {
        "command": {"kind": "shell", "command": "echo hi"},
        "environment": [],
    }


@pytest.mark.parametrize(
    ("definition", "path"),
    [
        pytest.param([], "$", id="not_object"),
        pytest.param({}, "$.command", id="no_command"),
        pytest.param({**ARGV, "extra": 1}, "$.extra", id="unknown_key"),
        pytest.param({"command": {"kind": "exec", "file": "x"}}, "$.command.kind", id="unknown_kind"),
        pytest.param({"command": {"kind": "argv"}}, "$.command.file", id="argv_without_file"),
        pytest.param({"command": {"kind": "argv", "file": ""}}, "$.command.file", id="empty_file"),
        pytest.param({"command": {"kind": "argv", "file": "./x"}}, "$.command.file", id="relative_file"),
        pytest.param({"command": {"kind": "argv", "file": "/bin/a\nb"}}, "$.command.file", id="control_in_file"),
        pytest.param({"command": {"kind": "argv", "file": "x", "args": ["a\x00"]}}, "$.command.args[0]", id="nul_arg"),
        pytest.param({"command": {"kind": "argv", "file": "x", "args": "a"}}, "$.command.args", id="args_not_list"),
        pytest.param({"command": {"kind": "argv", "file": "x", "args": ["a"] * 257}}, "$.command.args",
                     id="too_many_args"),
        pytest.param({"command": {"kind": "shell", "command": ""}}, "$.command.command", id="empty_shell"),
        pytest.param({"command": {"kind": "shell", "command": "x", "shell": "sh"}}, "$.command.shell",
                     id="relative_shell"),
        pytest.param({**ARGV, "workingDirectory": "tmp"}, "$.workingDirectory", id="relative_cwd"),
        pytest.param({**ARGV, "environment": [{"name": "1A", "value": ""}]}, "$.environment[0].name",
                     id="bad_env_name"),
        pytest.param({**ARGV, "environment": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
                     "$.environment[1].name", id="duplicate_env"),
        pytest.param({**ARGV, "environment": [{"name": "A"}]}, "$.environment[0].value", id="env_without_value"),
        pytest.param({**ARGV, "timeoutMs": 999}, "$.timeoutMs", id="timeout_too_small"),
        pytest.param({**ARGV, "timeoutMs": 1000.0}, "$.timeoutMs", id="timeout_float"),
        pytest.param({**ARGV, "timeoutMs": True}, "$.timeoutMs", id="timeout_bool"),
        pytest.param({"command": {"kind": "shell", "command": "x" * 65536}}, "$", id="over_64_kib"),
    ],
)
def test_rejects_a_bad_definition(definition: object, path: str) -> None:
    with pytest.raises(StoreError) as info:
        normalize_definition(definition)
    assert info.value.code == "invalid_input"
    assert info.value.message.startswith(path + ":")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["command", "kind", "file", "args", "shell", "environment", "name", "value", "timeoutMs",
                         "workingDirectory", "x"]), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(document=json_values)
def test_definition_validation_is_total(document: object) -> None:
    try:
        normalized = normalize_definition(document)
    except StoreError as exc:
        assert exc.code == "invalid_input"
        return
    assert normalize_definition(normalized) == normalized  # idempotent


def test_create_revise_and_replay(store: Store) -> None:
    first = _create(store)
    assert first.status == "created"
    assert (first.task.current.revision, first.task.status, first.task.name) == (1, "active", "Nightly")
    assert first.task.current.content_digest == content_digest(normalize_definition(ARGV))
    assert _create(store).status == "existing"  # mutation replay
    assert _create(store, mutation="m2").status == "existing"  # nothing changed: no empty revision
    changed = {"command": {"kind": "shell", "command": "echo bye"}, "timeoutMs": 60_000}
    revised = _create(store, changed, mutation="m3")
    assert (revised.status, revised.task.current.revision) == ("revised", 2)
    renamed = _create(store, changed, mutation="m4", name="Nightly job")
    assert (renamed.status, renamed.task.current.revision, renamed.task.name) == ("revised", 3, "Nightly job")
    with pytest.raises(StoreError) as info:
        _create(store, {"command": {"kind": "shell", "command": "other"}}, mutation="m1")
    assert info.value.code == "conflict"
    old = store.run(lambda c: resolve_revision_ref(c, "default", "nightly", first.task.current.ref))
    assert old.definition == normalize_definition(ARGV)


def test_disable_keeps_a_disabled_task_disabled_across_revisions(store: Store) -> None:
    _create(store)
    assert store.run(lambda c: set_task_status(c, "default", "nightly", "disabled", 200)) == "changed"
    assert store.run(lambda c: set_task_status(c, "default", "nightly", "disabled", 200)) == "unchanged"
    _create(store, {"command": {"kind": "shell", "command": "x"}}, mutation="m2")
    task = store.run(lambda c: get_task(c, "default", "nightly"))
    assert task is not None and task.status == "disabled" and task.current.revision == 2
    with pytest.raises(TaskNotFound):
        store.run(lambda c: set_task_status(c, "default", "missing", "disabled", 1))


def test_list_and_read(store: Store) -> None:
    for task_id in ("b", "a", "c"):
        _create(store, task_id=task_id)
    assert [t.task_id for t in store.run(lambda c: list_tasks(c, "default"))] == ["a", "b", "c"]
    assert [t.task_id for t in store.run(lambda c: list_tasks(c, "default", limit=1, after_task_id="a"))] == ["b"]
    assert store.run(lambda c: read_task(c, "default", "a")).to_json()["revision"] == 1
    with pytest.raises(TaskNotFound) as info:
        store.run(lambda c: read_task(c, "default", "zzz"))
    assert info.value.http_status == 404


def test_rejects_a_task_in_an_unknown_project(store: Store) -> None:
    with pytest.raises(StoreError) as info:
        store.run(lambda c: create_task(c, project_id="nope", task_id="t", name="T", definition=ARGV,
                                        mutation_id="m", created_by=ADMIN, now_ms=1))
    assert info.value.code == "not_found"


@pytest.mark.parametrize("task_id", ["", "-x", "a/b", "a b", "x" * 129])
def test_rejects_a_bad_task_id(store: Store, task_id: str) -> None:
    with pytest.raises(StoreError) as info:
        _create(store, task_id=task_id)
    assert info.value.code == "invalid_input"


def test_revision_ref_round_trip() -> None:
    digest = "ab" * 32
    assert revision_ref(7, digest) == f"qltd:v1:7:{digest}"
    assert parse_revision_ref(f"qltd:v1:7:{digest}") == (7, digest)
    for bad in (f"qltd:v1:0:{digest}", f"qltd:v1:07:{digest}", f"qltd:v2:7:{digest}", "qltd:v1:7:AB",
                f"qltd:v1:2147483648:{digest}"):
        with pytest.raises(StoreError):
            parse_revision_ref(bad)


def test_resolve_detects_an_altered_definition(store: Store) -> None:
    created = _create(store)
    store.run(lambda c: c.execute(
        'UPDATE "QingLongEdgeTaskRevisions" SET definition_json = ?',
        (canonical_definition({"command": {"kind": "shell", "command": "rm -rf /"}, "environment": []}),)))
    with pytest.raises(StoreError) as info:
        store.run(lambda c: resolve_revision_ref(c, "default", "nightly", created.task.current.ref))
    assert info.value.code == "not_found"
