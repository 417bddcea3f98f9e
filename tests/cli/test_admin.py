"""``qinglong-edge admin`` end to end, in a child process, against real files."""

from __future__ import annotations

import json
import pathlib
import re
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest

from qinglong_edge.local.identity import authenticate
from qinglong_edge.local.schema import SCHEMA_VERSION
from qinglong_edge.local.store import Store, now_ms
from tests.support.cli import REPO, Result, run_cli
from tests.support.ownership import foreign_directory
from tests.support.store import insert_run

TOKEN = re.compile(r"ql3c_([A-Za-z0-9][A-Za-z0-9._:-]{0,63})_([A-Za-z0-9_-]{43})")


@pytest.fixture
def site(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "schema": "qinglong/edge-agent@v1",
        "stateDirectory": str(tmp_path / "state"),
        "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
    }))
    yield tmp_path


def admin(site: pathlib.Path, *args: str) -> Result:
    return run_cli("--config", str(site / "config.json"), "admin", *args)


def ok_json(site: pathlib.Path, *args: str) -> dict[str, object]:
    # --json goes right after the sub-command words: --argv takes the rest of the line.
    words = next((i for i, a in enumerate(args) if a.startswith("--")), len(args))
    result = admin(site, *args[:words], "--json", *args[words:])
    assert result.status == 0, result.stderr + result.stdout
    payload = result.json()
    assert payload["ok"] is True
    return payload  # type: ignore[no-any-return]


def _authenticates(site: pathlib.Path, token: str) -> bool:
    with Store.open(str(site / "state" / "local.db")) as store:
        principal = store.run(lambda c: authenticate(
            c, [f"Bearer {token}"], now_ms(), keyring_directory=str(site / "state" / "pepper")))
    return principal is not None


def _provision(site: pathlib.Path) -> None:
    ok_json(site, "init")
    ok_json(site, "subject", "create", "--type", "user", "--id", "alice")
    ok_json(site, "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id", "alice",
            "--role", "operator", "--mutation-id", "grant-alice")


def test_needs_the_local_api_section(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"schema": "qinglong/edge-agent@v1", "stateDirectory": str(tmp_path)}))
    result = run_cli("--config", str(config), "admin", "init")
    assert result.status == 78
    assert "localApi" in result.stderr and "Traceback" not in result.stderr


def test_init_creates_database_keyring_and_key_idempotently(site: pathlib.Path) -> None:
    first = ok_json(site, "init")
    assert (first["pepperKey"], first["pepperKeyId"], first["keyringCreated"]) == ("created", "edge-pepper-v1", True)
    assert first["journalMode"] == "delete" and first["schemaVersion"] == SCHEMA_VERSION
    state = site / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "local.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((state / "pepper").stat().st_mode) == 0o700
    keys = list((state / "pepper").iterdir())
    assert [k.name for k in keys] == ["ZWRnZS1wZXBwZXItdjE.pepper"]
    assert stat.S_IMODE(keys[0].stat().st_mode) == 0o600 and len(keys[0].read_bytes()) == 43
    before = keys[0].read_bytes()
    second = ok_json(site, "init")
    assert (second["pepperKey"], second["keyringCreated"]) == ("existing", False)
    assert keys[0].read_bytes() == before


def test_credential_issue_prints_the_token_once_and_it_authenticates(site: pathlib.Path) -> None:
    _provision(site)
    result = admin(site, "credential", "issue", "--id", "alice-cli", "--subject-type", "user",
                   "--subject-id", "alice")
    assert result.status == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and TOKEN.fullmatch(lines[0])
    token = lines[0]
    secret = TOKEN.fullmatch(token).group(2)  # type: ignore[union-attr]
    assert secret not in result.stderr and "shown only once" in result.stderr
    assert secret.encode() not in (site / "state" / "local.db").read_bytes()  # only the HMAC digest is stored
    assert _authenticates(site, token)
    payload = ok_json(site, "credential", "issue", "--id", "alice-cli", "--subject-type", "user",
                      "--subject-id", "alice", "--expires-in-days", "1")
    assert payload["version"] == 2 and TOKEN.fullmatch(str(payload["token"]))
    assert _authenticates(site, str(payload["token"]))
    assert not _authenticates(site, token)  # rotated: the older version no longer matches
    assert ok_json(site, "credential", "revoke", "--id", "alice-cli")["status"] == "revoked"
    assert not _authenticates(site, str(payload["token"]))


def test_pepper_rotation_keeps_old_credentials_working(site: pathlib.Path) -> None:
    _provision(site)
    old = str(ok_json(site, "credential", "issue", "--id", "a1", "--subject-type", "user",
                      "--subject-id", "alice")["token"])
    ok_json(site, "pepper", "rotate", "--key-id", "edge-pepper-v2")
    new = ok_json(site, "credential", "issue", "--id", "a2", "--subject-type", "user", "--subject-id", "alice")
    assert new["pepperKeyId"] == "edge-pepper-v2"
    assert _authenticates(site, old) and _authenticates(site, str(new["token"]))


def test_roles_replay_by_mutation_id(site: pathlib.Path) -> None:
    _provision(site)
    again = ok_json(site, "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id",
                    "alice", "--role", "operator", "--mutation-id", "grant-alice")
    assert (again["status"], again["bindingVersion"]) == ("existing", 1)
    revoked = ok_json(site, "role", "revoke", "--project", "default", "--subject-type", "user", "--subject-id",
                      "alice")
    assert (revoked["status"], revoked["state"], revoked["bindingVersion"]) == ("inserted", "revoked", 2)
    conflict = admin(site, "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id",
                     "alice", "--role", "owner", "--mutation-id", "grant-alice")
    assert conflict.status == 65 and "conflict" in conflict.stderr


def test_task_create_list_and_runs_list(site: pathlib.Path) -> None:
    ok_json(site, "init")
    created = ok_json(site, "task", "create", "--project", "default", "--id", "nightly", "--name", "Nightly",
                      "--timeout-ms", "5000", "--env", "B=2", "--env", "A=1", "--mutation-id", "t1",
                      "--argv", "/bin/sh", "-c", "echo hi")
    task = created["task"]
    assert created["status"] == "created"
    assert task["definition"] == {  # type: ignore[index]
        "command": {"kind": "argv", "file": "/bin/sh", "args": ["-c", "echo hi"]},
        "environment": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        "timeoutMs": 5000,
    }
    replay = ok_json(site, "task", "create", "--project", "default", "--id", "nightly", "--name", "Nightly",
                     "--timeout-ms", "5000", "--env", "B=2", "--env", "A=1", "--mutation-id", "t1",
                     "--argv", "/bin/sh", "-c", "echo hi")
    assert replay["status"] == "existing"
    revised = ok_json(site, "task", "create", "--project", "default", "--id", "nightly", "--name", "Nightly",
                      "--shell", "echo bye", "--shell-path", "/bin/sh")
    assert (revised["status"], revised["task"]["revision"]) == ("revised", 2)  # type: ignore[index]
    listed = ok_json(site, "task", "list", "--project", "default")
    assert [t["taskId"] for t in listed["tasks"]] == ["nightly"]  # type: ignore[union-attr]
    assert ok_json(site, "task", "disable", "--project", "default", "--id", "nightly")["status"] == "changed"
    with Store.open(str(site / "state" / "local.db")) as store:
        store.run(lambda c: insert_run(c, "run-1", created_at_ms=10))
        store.run(lambda c: insert_run(c, "run-2", created_at_ms=20))
    runs = ok_json(site, "runs", "list", "--project", "default", "--limit", "1")
    assert [r["id"] for r in runs["runs"]] == ["run-2"] and runs["hasMore"] is True  # type: ignore[union-attr]
    human = admin(site, "runs", "list", "--project", "default")
    assert human.status == 0 and human.stdout.splitlines()[0].startswith("run-2\trunning")


@pytest.mark.parametrize(
    ("args", "status"),
    [
        pytest.param(("project", "create", "--id", "bad/id", "--name", "x", "--slug", "ok"), 65, id="bad_project_id"),
        pytest.param(("project", "create", "--id", "p", "--name", "x", "--slug", "Bad"), 65, id="bad_slug"),
        pytest.param(("subject", "create", "--type", "robot", "--id", "x"), 64, id="bad_subject_type"),
        pytest.param(("subject", "create", "--type", "user", "--id", ""), 65, id="empty_subject_id"),
        pytest.param(("role", "grant", "--project", "default", "--subject-type", "user", "--subject-id", "a",
                      "--role", "god"), 64, id="bad_role"),
        pytest.param(("role", "grant", "--project", "nope", "--subject-type", "user", "--subject-id", "a",
                      "--role", "viewer"), 65, id="unknown_project"),
        pytest.param(("role", "grant", "--project", "default", "--subject-type", "user", "--subject-id", "ghost",
                      "--role", "viewer"), 65, id="role_for_an_unknown_subject"),
        pytest.param(("credential", "issue", "--id", "bad id", "--subject-type", "user", "--subject-id", "a"),
                     65, id="bad_credential_id"),
        pytest.param(("credential", "issue", "--id", "c", "--subject-type", "user", "--subject-id", "ghost"),
                     65, id="unknown_subject"),
        pytest.param(("credential", "issue", "--id", "c", "--subject-type", "user", "--subject-id", "a",
                      "--expires-in-days", "0"), 64, id="bad_lifetime"),
        pytest.param(("task", "create", "--project", "default", "--id", "t", "--name", "T", "--env", "NOEQUALS",
                      "--shell", "x"), 64, id="env_without_equals"),
        pytest.param(("task", "create", "--project", "default", "--id", "t", "--name", "T", "--timeout-ms", "5",
                      "--shell", "x"), 65, id="timeout_too_small"),
        pytest.param(("task", "create", "--project", "default", "--id", "t", "--name", "T"), 64, id="no_command"),
        pytest.param(("runs", "list", "--project", "default", "--limit", "65"), 64, id="limit_too_large"),
        pytest.param(("task", "disable", "--project", "default", "--id", "ghost"), 65, id="unknown_task_disable"),
        pytest.param(("task", "enable", "--project", "default", "--id", "ghost"), 65, id="unknown_task_enable"),
    ],
)
def test_rejects_bad_input_with_a_clear_status(site: pathlib.Path, args: tuple[str, ...], status: int) -> None:
    ok_json(site, "init")
    result = admin(site, *args)
    assert result.status == status, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("qinglong-edge: ") or "usage:" in result.stderr


def test_role_grant_names_the_missing_subject_and_writes_nothing(site: pathlib.Path) -> None:
    """Issue 18: `admin role grant` accepted a subject that does not exist."""
    ok_json(site, "init")
    ok_json(site, "project", "create", "--id", "default", "--name", "Default")
    result = admin(site, "role", "grant", "--project", "default", "--subject-type", "user", "--subject-id", "alcie",
                   "--role", "operator")
    assert result.status == 65
    assert "not_found" in result.stderr and "user:alcie does not exist" in result.stderr
    assert "admin subject create --type user --id alcie" in result.stderr
    with Store.open(str(site / "state" / "local.db")) as store:
        rows = store.run(lambda c: c.execute('SELECT count(*) FROM "QingLong3ProjectRoleBindings"').fetchone()[0])
    assert rows == 0


def test_a_corrupted_database_is_refused_by_the_cli(site: pathlib.Path) -> None:
    ok_json(site, "init")
    db = site / "state" / "local.db"
    data = bytearray(db.read_bytes())
    data[0:16] = b"garbage garbage!"
    db.write_bytes(bytes(data))
    result = admin(site, "runs", "list", "--project", "default")
    assert result.status == 74
    assert "database_corrupt" in result.stderr and "untouched" in result.stderr
    assert db.read_bytes() == bytes(data)


def test_admin_help_imports_no_sqlite() -> None:
    probe = (
        "import sys\nfrom qinglong_edge.cli import main\n"
        "try:\n    main(['admin', 'task', 'create', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlite3', '_sqlite3', 'ssl', 'socket')))\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


@pytest.mark.root
def test_rejects_admin_as_another_user_than_the_state_owner(tmp_path: pathlib.Path) -> None:
    # README: run `admin` as the service user. Run as root by mistake, it must say so and
    # leave nothing behind that the service user could not open.
    state = foreign_directory(tmp_path / "state")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"schema": "qinglong/edge-agent@v1", "stateDirectory": str(state),
                                  "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}}}))
    result = run_cli("--config", str(config), "admin", "init")
    assert result.status == 73, result.stderr
    assert "unsafe_storage" in result.stderr and "uid 65534" in result.stderr
    assert list(state.iterdir()) == []
