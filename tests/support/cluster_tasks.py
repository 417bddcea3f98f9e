"""Queued attempts with real execution revisions for the cluster double (tests, demo).

The revision is built by :func:`qinglong_edge.contracts.execution_revision.normalize_execution_revision`
(canonical key order, commands and bindings normalized, ICU environment order), so its
``contentDigest`` is the genuine digest of offer-delivery.md 2.4 that a worker
recomputes, whatever the test passes.

Presets (``build_task(kind)``): ``shell`` (``/bin/sh`` runs an ``echo`` of one public
variable, timeoutMs 60 000) and ``python`` (argv ``/usr/bin/python3 -c ...`` in ``/tmp``,
a public and a secret binding given out of ICU order, timeoutMs 120 000; the secret
``api_key`` has a value the double delivers). Anything else: :func:`command_task`::

    command_task("echo $GREETING $API_KEY", env={"GREETING": "hi"}, secrets={"API_KEY": "s3cr3t"},
                 bundle={"FROM_BUNDLE": "1"}, timeout_ms=5_000)
    command_task(["/bin/sh", "-c", "exit 3"])                      # argv form
    build_task("custom", command=shell_command("true"), environment=[public("A", "1")])

Secret bindings refer to project secrets the returned :class:`Candidate` carries
(``candidate.secrets``: ref -> value); :meth:`ClusterState.add_candidate` gives them to the
double's secret store, so the secrets route delivers them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from qinglong_edge.contracts.execution_revision import (
    EXECUTOR_TYPE,
    PLAN_SCHEMA,
    create_secret_ref,
    normalize_execution_revision,
)
from qinglong_edge.contracts.ids import new_uuid4
from tests.support.cluster_secrets import bundle_value
from tests.support.cluster_state import Candidate, compact, wall_ms

__all__ = ["PYTHON_SECRET_VALUE", "TASK_KINDS", "argv_command", "build_task", "command_task", "public", "secret",
           "shell_command"]

TASK_KINDS = ("shell", "python", "custom")
#: The value of the ``python`` preset's ``api_key`` secret.
PYTHON_SECRET_VALUE = "python-preset-secret"
_UNSET: Any = object()


def argv_command(file: str, *args: str) -> dict[str, Any]:
    """The argv form ``{"kind":"argv","file","args"}`` (``file`` an absolute path)."""
    return {"kind": "argv", "file": file, "args": list(args)}


def shell_command(command: str, shell: str | None = "/bin/sh") -> dict[str, Any]:
    """The shell form ``{"kind":"shell","command"[,"shell"]}`` (``/bin/sh`` or ``/bin/bash``)."""
    out: dict[str, Any] = {"kind": "shell", "command": command}
    if shell is not None:
        out["shell"] = shell
    return out


def public(name: str, value: str) -> dict[str, str]:
    return {"name": name, "kind": "public", "value": value}


def secret(name: str, ref: str) -> dict[str, str]:
    return {"name": name, "kind": "secret", "secretRef": ref}


def build_task(
    kind: str = "shell",
    *,
    project_id: str = "project-1",
    now_ms: int | None = None,
    placement: dict[str, Any] | None = _UNSET,
    command: dict[str, Any] | None = None,
    environment: Sequence[Mapping[str, str]] | None = None,
    environment_bundle_ref: str | None = None,
    working_directory: str | None = None,
    timeout_ms: int | None = _UNSET,
    task_id: str | None = None,
    secrets: Mapping[str, str] | None = None,
    run_id: str | None = None,
    attempt_id: str | None = None,
    source_content_digest: str | None = None,
) -> Candidate:
    """A queued attempt with a real execution revision (digest computed by the normalizer).

    Args:
        kind: ``shell`` / ``python`` (presets, see the module docstring; the other
            arguments override their parts) or ``custom`` (``command`` required).
        command: the ``qinglong/command-execution@v1`` command (:func:`argv_command`,
            :func:`shell_command`).
        environment: bindings (:func:`public`, :func:`secret`), any order.
        placement: the revision's placement (default: requires the ``remote-worker``
            executor); None: no ``placement`` key (the golden vectors' revision).
        environment_bundle_ref: a versioned ``qlsecret:v1:`` ref of this project.
        timeout_ms: 1 - 31 536 000 000, or None for no ``timeoutMs``.
        secrets: secretRef -> value the double must be able to deliver.
        run_id, attempt_id: fixed ids (default: fresh UUIDs), e.g. the ``run-1`` /
            ``attempt-1`` of the golden vectors.
        source_content_digest: 64 hex (default: a digest of the task's content); the
            taskRevision is ``qltd:v1:1:<it>``.

    Raises:
        ValueError: an unknown kind, or ``custom`` without a command.
        ContractError: the revision breaks a rule of the normalizer.
    """
    now = wall_ms() if now_ms is None else now_ms
    values = dict(secrets or {})
    if kind == "shell":
        preset_command: dict[str, Any] = shell_command('echo "hello from $GREETING"')
        preset_env: list[Mapping[str, str]] = [public("GREETING", "qinglong-edge")]
        extra: dict[str, Any] = {"timeoutMs": 60_000}
    elif kind == "python":
        preset_command = argv_command("/usr/bin/python3", "-c", "import os; print(os.environ['API_URL'])")
        ref = create_secret_ref(project_id, "api_key", 1)
        values.setdefault(ref, PYTHON_SECRET_VALUE)
        preset_env = [public("API_URL", "https://api.example/v1"), secret("api_key", ref)]
        extra = {"workingDirectory": "/tmp", "timeoutMs": 120_000}
    elif kind == "custom":
        if command is None:
            raise ValueError("a custom task needs a command")
        preset_command, preset_env, extra = command, [], {}
    else:
        raise ValueError(f"unknown task kind {kind!r} (known: {', '.join(TASK_KINDS)})")
    command = preset_command if command is None else command
    bindings = [dict(b) for b in (preset_env if environment is None else environment)]
    if timeout_ms is not _UNSET:
        extra.pop("timeoutMs", None)
        if timeout_ms is not None:
            extra["timeoutMs"] = timeout_ms
    if working_directory is not None:
        extra["workingDirectory"] = working_directory
    if environment_bundle_ref is not None:
        extra["environmentBundleRef"] = environment_bundle_ref
    source_digest = source_content_digest or hashlib.sha256(compact([command, bindings, extra])).hexdigest()
    task = task_id or f"task-{kind}"
    source = {
        "projectId": project_id,
        "taskId": task,
        "taskRevision": f"qltd:v1:1:{source_digest}",
        "sourceRevision": 1,
        "sourceContentDigest": source_digest,
        "executorType": EXECUTOR_TYPE,
        "planSchema": PLAN_SCHEMA,
        "command": command,
        "environment": bindings,
        **extra,
        "createdAtMs": now,
    }
    if placement is _UNSET:
        source["placement"] = {"required": {"executors": ["remote-worker"]}}
    elif placement is not None:
        source["placement"] = placement
    revision = normalize_execution_revision(source, verify_digest=False)
    candidate = {
        "runId": run_id or new_uuid4(),
        "attemptId": attempt_id or new_uuid4(),
        "projectId": project_id,
        "taskId": task,
        "taskRevision": revision["taskRevision"],
        "priority": 0,
        "queuedAtMs": now,
        "attemptCreatedAtMs": now,
        "attemptNumber": 1,
        "executorType": EXECUTOR_TYPE,
    }
    return Candidate(candidate, revision, secrets=values)


def command_task(
    command: str | Sequence[str] | dict[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    secrets: Mapping[str, str] | None = None,
    bundle: Mapping[str, str] | None = None,
    timeout_ms: int | None = None,
    working_directory: str | None = None,
    task_id: str = "task-custom",
    project_id: str = "project-1",
    now_ms: int | None = None,
    placement: dict[str, Any] | None = _UNSET,
) -> Candidate:
    """A custom task in one call.

    Args:
        command: a string (shell form, ``/bin/sh -c``), a sequence (argv form: an
            absolute file, then its args) or a command dict.
        env: public bindings, name -> value.
        secrets: secret bindings, name -> value: each becomes the project secret of the
            same name (``qlsecret:v1:`` ref without a version) bound under that name.
        bundle: an environment bundle (name -> value) defined as the project secret
            ``<task_id>-bundle`` version 1 and referenced by ``environmentBundleRef``.
        timeout_ms: None for no ``timeoutMs``.
    """
    if isinstance(command, str):
        spec = shell_command(command)
    elif isinstance(command, dict):
        spec = command
    else:
        spec = argv_command(command[0], *command[1:])
    bindings = [public(name, value) for name, value in (env or {}).items()]
    values: dict[str, str] = {}
    for name, value in (secrets or {}).items():
        ref = create_secret_ref(project_id, name)
        values[ref] = value
        bindings.append(secret(name, ref))
    bundle_ref = None
    if bundle is not None:
        bundle_ref = create_secret_ref(project_id, f"{task_id}-bundle", 1)
        values[bundle_ref] = bundle_value(bundle)
    return build_task("custom", project_id=project_id, now_ms=now_ms, placement=placement, command=spec,
                      environment=bindings, environment_bundle_ref=bundle_ref, working_directory=working_directory,
                      timeout_ms=timeout_ms, task_id=task_id, secrets=values)
