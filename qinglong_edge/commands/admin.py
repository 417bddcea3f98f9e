"""``qinglong-edge admin``: provision the Local store (database, pepper keyring, identities).

Sub-commands (all need the configuration's ``localApi`` section, else exit 78)::

    admin init [--pepper-key-id ID]                  database + keyring dir + first pepper key
    admin pepper rotate --key-id ID                  new key file, registered and activated
    admin project create --id ID --name NAME [--slug SLUG]
    admin project archive --id ID
    admin subject create --type TYPE --id ID
    admin subject disable|enable --type TYPE --id ID
    admin credential issue --id CRED --subject-type TYPE --subject-id ID [--expires-in-days N]
    admin credential revoke --id CRED
    admin role grant --project P --subject-type TYPE --subject-id ID --role ROLE [--mutation-id M]
    admin role revoke --project P --subject-type TYPE --subject-id ID [--mutation-id M]
    admin task create --project P --id T --name N [--cwd DIR] [--env K=V]... [--timeout-ms MS]
                      [--mutation-id M] (--shell 'CMD' [--shell-path /bin/sh] | --argv FILE ARG...)
    admin task list --project P
    admin task disable|enable --project P --id T
    admin runs list --project P [--limit N]          read-only
    admin runs log RUN_ID [--attempt N] [--max-bytes N] [--tail]   a Run's log (commands/admin_storage.py)
    admin prune                                      prune every store to its cap now (admin_storage.py)

``credential issue`` prints the token exactly once, on stdout (alone on its line, so
``TOKEN=$(qinglong-edge admin credential issue ...)`` works; the details go to stderr),
or inside the ``--json`` object; it is never logged or stored. ``--argv`` takes the rest
of the command line, so it comes last.

Idempotency: ``init``, ``project create``, ``subject create`` and ``task create`` (same
definition) are no-ops when repeated; ``role grant|revoke`` and ``task create`` replay by
``--mutation-id`` (a fresh id is generated when omitted). ``credential issue`` on an
existing id issues the next version (a rotation: the older token stops working).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from qinglong_edge.commands._output import emit, print_json

ADMIN_SUBJECT_ID = "qinglong-edge-admin"
DEFAULT_PEPPER_KEY_ID = "edge-pepper-v1"
SUBJECT_TYPES = ("user", "api_app", "mcp_client", "agent", "system", "worker")
CREDENTIAL_SUBJECT_TYPES = ("user", "api_app", "mcp_client", "agent")
ROLES = ("owner", "admin", "operator", "viewer")

def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    admin = subparsers.add_parser(
        "admin",
        parents=[common],
        help="provision the Local store: database, pepper keys, projects, identities, tasks",
        description="Operator commands for the Local API store (needs the localApi configuration section).",
    )
    admin.set_defaults(handler=lambda args: _print_help(admin, args))
    groups = admin.add_subparsers(dest="admin_group", metavar="GROUP", parser_class=type(admin))

    init = groups.add_parser("init", parents=[common], help="create the database, keyring and first pepper key")
    init.add_argument("--pepper-key-id", default=DEFAULT_PEPPER_KEY_ID, metavar="ID")
    init.set_defaults(handler=_init)

    pepper = _group(groups, "pepper", common, "pepper keys")
    rotate = pepper.add_parser("rotate", parents=[common], help="create and activate a new pepper key")
    rotate.add_argument("--key-id", required=True, metavar="ID")
    rotate.set_defaults(handler=_pepper_rotate)

    project = _group(groups, "project", common, "projects")
    create = project.add_parser("create", parents=[common], help="create a project")
    create.add_argument("--id", required=True, dest="project_id")
    create.add_argument("--name", required=True)
    create.add_argument("--slug", help="lowercase [a-z0-9-] (default: derived from the id)")
    create.set_defaults(handler=_project_create)
    archive = project.add_parser("archive", parents=[common], help="archive a project (read-only afterwards)")
    archive.add_argument("--id", required=True, dest="project_id")
    archive.set_defaults(handler=_project_archive)

    subject = _group(groups, "subject", common, "identity subjects")
    for action in ("create", "disable", "enable"):
        sub = subject.add_parser(action, parents=[common], help=f"{action} a subject")
        sub.add_argument("--type", required=True, choices=SUBJECT_TYPES, dest="subject_type")
        sub.add_argument("--id", required=True, dest="subject_id")
        sub.set_defaults(handler=_subject, action=action)

    credential = _group(groups, "credential", common, "ql3c API credentials")
    issue = credential.add_parser("issue", parents=[common], help="issue a credential; prints the token once")
    issue.add_argument("--id", required=True, dest="credential_id")
    issue.add_argument("--subject-type", required=True, choices=CREDENTIAL_SUBJECT_TYPES)
    issue.add_argument("--subject-id", required=True)
    issue.add_argument("--expires-in-days", type=int, default=365, metavar="N", help="1-3650 (default 365)")
    issue.set_defaults(handler=_credential_issue)
    revoke = credential.add_parser("revoke", parents=[common], help="revoke every version of a credential")
    revoke.add_argument("--id", required=True, dest="credential_id")
    revoke.set_defaults(handler=_credential_revoke)

    role = _group(groups, "role", common, "project role bindings")
    for action in ("grant", "revoke"):
        sub = role.add_parser(action, parents=[common], help=f"{action} a role (appends a binding version)")
        sub.add_argument("--project", required=True)
        sub.add_argument("--subject-type", required=True, choices=SUBJECT_TYPES)
        sub.add_argument("--subject-id", required=True)
        if action == "grant":
            sub.add_argument("--role", required=True, choices=ROLES)
        sub.add_argument("--mutation-id", help="replay key (default: a new UUID)")
        sub.set_defaults(handler=_role, action=action)

    task = _group(groups, "task", common, "Local tasks")
    task_create = task.add_parser("create", parents=[common], help="create a task or a new revision")
    task_create.add_argument("--project", required=True)
    task_create.add_argument("--id", required=True, dest="task_id")
    task_create.add_argument("--name", required=True)
    task_create.add_argument("--cwd", help="absolute working directory")
    task_create.add_argument("--env", action="append", default=[], metavar="K=V")
    task_create.add_argument("--timeout-ms", type=int)
    task_create.add_argument("--mutation-id", help="replay key (default: a new UUID)")
    task_create.add_argument("--shell-path", help="absolute shell for --shell (default /bin/sh)")
    command = task_create.add_mutually_exclusive_group(required=True)
    command.add_argument("--shell", metavar="CMD", help="a shell command line")
    command.add_argument("--argv", nargs=argparse.REMAINDER, metavar="FILE", help="program and arguments (last)")
    task_create.set_defaults(handler=_task_create)
    task_list = task.add_parser("list", parents=[common], help="list a project's tasks")
    task_list.add_argument("--project", required=True)
    task_list.set_defaults(handler=_task_list)
    for action in ("disable", "enable"):
        sub = task.add_parser(action, parents=[common], help=f"{action} a task")
        sub.add_argument("--project", required=True)
        sub.add_argument("--id", required=True, dest="task_id")
        sub.set_defaults(handler=_task_status, action=action)

    runs = _group(groups, "runs", common, "Runs and their logs (read-only)")
    runs_list = runs.add_parser("list", parents=[common], help="list a project's newest Runs")
    runs_list.add_argument("--project", required=True)
    runs_list.add_argument("--limit", type=int, default=32, help="1-64 (default 32)")
    runs_list.set_defaults(handler=_runs_list)

    from qinglong_edge.commands import admin_storage

    admin_storage.register(groups, runs, common)


def _print_help(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.json:  # --json promises one JSON line, not the help text
        from qinglong_edge.errors import UsageError

        raise UsageError("admin needs a group: init, pepper, project, subject, credential, role, task, runs or prune")
    parser.print_help()
    return 64


def _group(groups: Any, name: str, common: argparse.ArgumentParser, what: str) -> Any:
    parser = groups.add_parser(name, parents=[common], help=f"manage {what}")
    return parser.add_subparsers(dest=f"{name}_action", metavar="ACTION", parser_class=type(parser), required=True)


# -- shared plumbing -------------------------------------------------------------------


class _Context:
    """The configuration's Local API paths and an open store (closed on exit)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from qinglong_edge.config import load_config
        from qinglong_edge.errors import ConfigError

        config = load_config(args.config)
        if config.local_api is None:
            raise ConfigError("the configuration has no localApi section", path="$.localApi")
        self.local_api = config.local_api
        self.profile = config.profile
        self.store: Any = None

    def open(self) -> Any:
        from qinglong_edge.local.guards import check_database_present
        from qinglong_edge.local.store import Store

        # Like serve: never create an empty database where the keyring proves one existed.
        check_database_present(self.local_api.database_file, self.local_api.pepper_keyring_directory)
        self.store = Store.open(
            self.local_api.database_file, profile=self.profile, busy_timeout_ms=self.local_api.busy_timeout_ms
        )
        return self.store

    def __enter__(self) -> _Context:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.store is not None:
            self.store.close()


def _usage(message: str) -> Exception:
    from qinglong_edge.errors import UsageError

    return UsageError(message)


def _admin_subject() -> Any:
    from qinglong_edge.local.identity import Subject

    return Subject("system", ADMIN_SUBJECT_ID)


def _subject(args: argparse.Namespace) -> int:
    from qinglong_edge.local.identity import Subject, create_subject, set_subject_status
    from qinglong_edge.local.store import now_ms

    subject = Subject(args.subject_type, args.subject_id)
    with _Context(args) as ctx:
        store = ctx.open()
        if args.action == "create":
            status = store.run(lambda c: create_subject(c, subject, now_ms()))
        else:
            state = "disabled" if args.action == "disable" else "active"
            status = store.run(lambda c: set_subject_status(c, subject, state, now_ms()))
    emit(args.json, f"subject {subject.type}:{subject.id}: {status}",
         {"ok": True, "status": status, "subjectType": subject.type, "subjectId": subject.id})
    return 0


# -- init and pepper -------------------------------------------------------------------


def _ensure_key(store: Any, keyring: str, key_id: str) -> str:
    """Create, register and activate ``key_id`` unless a key is already active."""
    from qinglong_edge.local.identity import activate_pepper_key, active_pepper_key, register_pepper_key
    from qinglong_edge.local.pepper import PepperError, create_pepper, read_pepper
    from qinglong_edge.local.store import now_ms

    active = store.run(active_pepper_key)
    if active is not None:
        read_pepper(keyring, active.pepper_key_id)  # the file must be there and safe
        return "existing"
    try:
        material = create_pepper(keyring, key_id)
        status = "created"
    except PepperError as exc:
        if exc.code != "conflict":
            raise
        material = read_pepper(keyring, key_id)  # left by an interrupted init: adopt it
        status = "adopted"
    store.run(lambda c: register_pepper_key(c, material, now_ms()))
    store.run(lambda c: activate_pepper_key(c, key_id, now_ms()))
    return status


def _init(args: argparse.Namespace) -> int:
    from qinglong_edge.local.guards import check_keyring_present
    from qinglong_edge.local.pepper import ensure_keyring_directory

    with _Context(args) as ctx:
        keyring = ctx.local_api.pepper_keyring_directory
        # Before anything is made: an empty keyring where the database names keys would
        # only hide the loss (serve would then answer every request 503).
        check_keyring_present(ctx.local_api.database_file, keyring)
        store = ctx.open()  # first: a missing state directory is created 0700 for the database
        created_dir = ensure_keyring_directory(keyring)
        key_status = _ensure_key(store, keyring, args.pepper_key_id)
        from qinglong_edge.local.identity import active_pepper_key

        active = store.run(active_pepper_key)
        payload = {
            "ok": True,
            "database": store.path,
            "schemaVersion": store.schema_version,
            "journalMode": store.journal_mode,
            "journalFallback": store.journal_fallback,
            "keyringDirectory": keyring,
            "keyringCreated": created_dir,
            "pepperKeyId": active.pepper_key_id,
            "pepperKey": key_status,
        }
    emit(args.json, (
        f"database {payload['database']} (schema {payload['schemaVersion']}, journal {payload['journalMode']})\n"
        f"pepper keyring {keyring}; active key {payload['pepperKeyId']} ({key_status})"
    ), payload)
    return 0


def _pepper_rotate(args: argparse.Namespace) -> int:
    from qinglong_edge.local.identity import activate_pepper_key, register_pepper_key
    from qinglong_edge.local.pepper import create_pepper, ensure_keyring_directory
    from qinglong_edge.local.store import now_ms

    with _Context(args) as ctx:
        store = ctx.open()
        # A lost keyring (keyring_missing) is recovered from by a new key: make its
        # directory (0700) as admin init would, rather than send the operator there.
        ensure_keyring_directory(ctx.local_api.pepper_keyring_directory)
        material = create_pepper(ctx.local_api.pepper_keyring_directory, args.key_id)
        store.run(lambda c: register_pepper_key(c, material, now_ms()))
        store.run(lambda c: activate_pepper_key(c, args.key_id, now_ms()))
    emit(args.json, f"pepper key {args.key_id} is active; older keys are retired and still verify",
         {"ok": True, "pepperKeyId": args.key_id, "status": "activated"})
    return 0


# -- projects, credentials, roles ------------------------------------------------------


def _project_create(args: argparse.Namespace) -> int:
    from qinglong_edge.local.policy import create_project
    from qinglong_edge.local.store import now_ms

    slug = args.slug
    if slug is None:
        slug = args.project_id.lower().replace(".", "-").replace(":", "-").replace("_", "-")
    with _Context(args) as ctx:
        store = ctx.open()
        status = store.run(lambda c: create_project(c, args.project_id, args.name, slug, now_ms()))
    emit(args.json, f"project {args.project_id}: {status}",
         {"ok": True, "status": status, "projectId": args.project_id, "slug": slug})
    return 0


def _project_archive(args: argparse.Namespace) -> int:
    from qinglong_edge.local.policy import archive_project
    from qinglong_edge.local.store import now_ms

    with _Context(args) as ctx:
        store = ctx.open()
        project = store.run(lambda c: archive_project(c, args.project_id, now_ms()))
    emit(args.json, f"project {project.id}: archived (version {project.version})",
         {"ok": True, "projectId": project.id, "status": project.status, "version": project.version})
    return 0


def _credential_issue(args: argparse.Namespace) -> int:
    import secrets

    from qinglong_edge.contracts.credentials import encode_secret
    from qinglong_edge.local.identity import Subject, active_pepper_key, issue_credential
    from qinglong_edge.local.pepper import read_pepper
    from qinglong_edge.local.store import now_ms

    if not 1 <= args.expires_in_days <= 3650:
        raise _usage("--expires-in-days must be 1-3650")
    subject = Subject(args.subject_type, args.subject_id)
    with _Context(args) as ctx:
        store = ctx.open()
        active = store.run(active_pepper_key)
        if active is None:
            from qinglong_edge.errors import StoreError

            raise StoreError("no active pepper key: run 'qinglong-edge admin init' first", code="pepper_unavailable")
        material = read_pepper(ctx.local_api.pepper_keyring_directory, active.pepper_key_id)
        secret = encode_secret(secrets.token_bytes(32))
        now = now_ms()
        record = store.run(lambda c: issue_credential(
            c, credential_id=args.credential_id, subject=subject, secret=secret, pepper=material,
            now_ms=now, expires_at_ms=now + args.expires_in_days * 86_400_000,
        ))
    token = f"ql3c_{record.credential_id}_{secret}"
    details = {
        "credentialId": record.credential_id,
        "version": record.version,
        "subjectType": subject.type,
        "subjectId": subject.id,
        "pepperKeyId": record.pepper_key_id,
        "notBeforeAtMs": record.not_before_at_ms,
        "expiresAtMs": record.expires_at_ms,
    }
    if args.json:
        print_json({"ok": True, **details, "token": token})
    else:
        sys.stdout.write(token + "\n")
        sys.stdout.flush()
        sys.stderr.write(
            f"credential {record.credential_id} version {record.version} for {subject.type}:{subject.id}; "
            "the token above is shown only once\n"
        )
    return 0


def _credential_revoke(args: argparse.Namespace) -> int:
    from qinglong_edge.local.identity import revoke_credential

    with _Context(args) as ctx:
        store = ctx.open()
        status = store.run(lambda c: revoke_credential(c, args.credential_id))
    emit(args.json, f"credential {args.credential_id}: {status}",
         {"ok": True, "status": status, "credentialId": args.credential_id})
    return 0


def _role(args: argparse.Namespace) -> int:
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.errors import StoreError
    from qinglong_edge.local.identity import Subject, get_subject
    from qinglong_edge.local.policy import grant_role, revoke_role
    from qinglong_edge.local.store import now_ms

    subject = Subject(args.subject_type, args.subject_id)
    mutation = args.mutation_id or new_uuid4()

    def grant(conn: Any) -> Any:
        # A binding for a subject that does not exist would be a role nobody can use,
        # and hides a typo in --subject-id (issue 18): refuse it, in the same operation.
        if get_subject(conn, subject) is None:
            raise StoreError(
                f"subject {subject.type}:{subject.id} does not exist: create it first with 'qinglong-edge admin "
                f"subject create --type {subject.type} --id {subject.id}'", code="not_found")
        return grant_role(conn, args.project, subject, args.role, mutation_id=mutation, changed_by=_admin_subject(),
                          now_ms=now_ms())

    with _Context(args) as ctx:
        store = ctx.open()
        if args.action == "grant":
            result = store.run(grant)
        else:
            result = store.run(lambda c: revoke_role(c, args.project, subject, mutation_id=mutation,
                                                     changed_by=_admin_subject(), now_ms=now_ms()))
    binding = result.binding
    emit(args.json, (
        f"{subject.type}:{subject.id} on {args.project}: {binding.state}"
        + (f" {binding.role}" if binding.role else "") + f" (binding version {binding.version}, {result.status})"
    ), {"ok": True, "status": result.status, "projectId": args.project, "subjectType": subject.type,
        "subjectId": subject.id, "state": binding.state, "role": binding.role, "bindingVersion": binding.version,
        "mutationId": binding.mutation_id})
    return 0


# -- tasks and runs --------------------------------------------------------------------


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    if args.argv is not None:
        if not args.argv:
            raise _usage("--argv needs a program")
        if args.shell_path is not None:
            raise _usage("--shell-path goes with --shell")
        command: dict[str, Any] = {"kind": "argv", "file": args.argv[0], "args": list(args.argv[1:])}
    else:
        command = {"kind": "shell", "command": args.shell}
        if args.shell_path is not None:
            command["shell"] = args.shell_path
    definition: dict[str, Any] = {"command": command}
    if args.cwd is not None:
        definition["workingDirectory"] = args.cwd
    environment = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise _usage(f"--env {item!r}: expected NAME=VALUE")
        environment.append({"name": name, "value": value})
    definition["environment"] = environment
    if args.timeout_ms is not None:
        definition["timeoutMs"] = args.timeout_ms
    return definition


def _task_create(args: argparse.Namespace) -> int:
    from qinglong_edge.contracts.ids import new_uuid4
    from qinglong_edge.local.store import now_ms
    from qinglong_edge.local.tasks import create_task

    definition = _definition(args)
    mutation = args.mutation_id or new_uuid4()
    with _Context(args) as ctx:
        store = ctx.open()
        result = store.run(lambda c: create_task(
            c, project_id=args.project, task_id=args.task_id, name=args.name, definition=definition,
            mutation_id=mutation, created_by=_admin_subject(), now_ms=now_ms(),
        ))
    task = result.task
    emit(args.json, (
        f"task {task.project_id}/{task.task_id}: {result.status}, revision {task.current.revision}, "
        f"content digest {task.current.content_digest}"
    ), {"ok": True, "status": result.status, "task": task.to_json()})
    return 0


def _task_list(args: argparse.Namespace) -> int:
    from qinglong_edge.local.tasks import list_tasks

    with _Context(args) as ctx:
        store = ctx.open()
        tasks: list[Any] = []
        after: str | None = None
        while True:
            page = store.run(lambda c, a=after: list_tasks(c, args.project, limit=1000, after_task_id=a))
            tasks += page
            if len(page) < 1000:
                break
            after = page[-1].task_id
    if args.json:
        print_json({"ok": True, "projectId": args.project, "tasks": [t.to_json() for t in tasks]})
    else:
        for t in tasks:
            print(f"{t.task_id}\t{t.status}\trev {t.current.revision}\t{t.current.content_digest[:12]}\t{t.name}")
        if not tasks:
            print(f"no tasks in project {args.project}")
    return 0


def _task_status(args: argparse.Namespace) -> int:
    from qinglong_edge.local.store import now_ms
    from qinglong_edge.local.tasks import set_task_status

    status = "disabled" if args.action == "disable" else "active"
    with _Context(args) as ctx:
        store = ctx.open()
        result = store.run(lambda c: set_task_status(c, args.project, args.task_id, status, now_ms()))
    emit(args.json, f"task {args.project}/{args.task_id}: {status} ({result})",
         {"ok": True, "status": result, "taskStatus": status})
    return 0


def _runs_list(args: argparse.Namespace) -> int:
    from qinglong_edge.local.runs import list_runs

    if not 1 <= args.limit <= 64:
        raise _usage("--limit must be 1-64")
    with _Context(args) as ctx:
        store = ctx.open()
        body = store.run(lambda c: list_runs(c, args.project, limit=args.limit))
    if args.json:
        print_json({"ok": True, "projectId": args.project, **body})
    else:
        for run in body["runs"]:
            print(f"{run['id']}\t{run['status']}\tv{run['version']}\t{run['taskId']}\t{run['createdAtMs']}")
        if not body["runs"]:
            print(f"no runs in project {args.project}")
    return 0
