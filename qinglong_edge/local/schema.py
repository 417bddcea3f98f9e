"""The Local store's SQL: versioned migrations, applied in order, each in one transaction.

Sources: local-api.md section 5 (tables, columns, CHECKs, foreign keys, unique keys and
indexes of the reference's ``packages/ql3-local-sqlite/src/migrations`` 0001, 0009,
0011, 0017, 0019 and 0051), spec README ("Local API", "SQLite"). The statements are
our own text; the table and column names, enums and limits are the contract.

Tables (stable names; other modules query them directly):

=========================================  =============================================
``QingLong3Projects``                       projects; migration 1 seeds ``default``
``QingLong3ProjectRoleBindings``            append-only role binding versions
``QingLong3SecurityAuditEvents``            security audit; **no** FK on ``project_id``
``QingLong3IdentitySubjects``               subjects (user, api_app, ..., worker)
``QingLong3ApiCredentials``                 ``ql3c`` credential versions
``QingLong3LocalOwnerPepperKeys``           pepper key catalog (at most one ``active``)
``QingLong3LocalOwnerPepperActivations``    activation history (generation 1, 2, ...)
``QingLong3ApiCredentialPepperBindings``    credential version -> pepper key
``Runs`` / ``RunAttempts`` / ``RunEvents``  the Run core (section 5.5-5.7)
``StepRuns`` / ``StepRunMutations``         step runs (section 5.8; nothing writes them yet)
``QingLongEdgeTasks``                       our Local task heads (the spec has none)
``QingLongEdgeTaskRevisions``               their immutable revisions
``QingLongEdgeLogRetirements``              tombstones of Run logs pruned by the log cap
``schema_migrations``                       one row per applied migration (this module)
``store_probe``                             one row rewritten by every open (write probe)
=========================================  =============================================

Decisions where we differ from the reference, and why:

* ``QingLong3SecurityAuditEvents.project_id`` has no foreign key, so a request for an
  unknown project is audited and answered 403 (spec README, "Unknown project"), not the
  reference's accidental 503.
* Local task tables are ours: ``QingLongEdgeTasks(project_id, id, name, status,
  current_revision, ...)`` and ``QingLongEdgeTaskRevisions(project_id, task_id,
  revision, content_digest, definition_json, executable, mutation_id, ...)``.
  A Run's ``task_revision`` is ``qltd:v1:<revision>:<contentDigest>``
  (:mod:`qinglong_edge.local.tasks`).
* ``StepRuns``: the reference also installs reference triggers we could not read; the
  table and its CHECKs are here, the triggers are not.
* ``QingLong3SecurityAuditEvents`` gains two nullable columns (migration 5):
  ``refused_count`` and ``refused_since_ms``. NULL on every row of a request that reached
  admission; set on a *summary* row: the requests without a valid credential refused
  with 429 ``rate_limited`` over ``[refused_since_ms, occurred_at_ms]`` for one reason
  (spec README, "Decisions for storage on flash"; :mod:`qinglong_edge.local.budget`).

Adding a migration: append a :class:`Migration` with the next version to
:data:`MIGRATIONS`; never edit a released one (the store keeps a SHA-256 of each
migration's statements in ``schema_migrations.checksum`` and refuses a database whose
applied migration differs: code ``schema_mismatch``). A database whose highest applied
version is above :data:`SCHEMA_VERSION` is refused with ``database_newer``.

Requires SQLite >= 3.35 with the JSON functions (built in since 3.38; most 3.35-3.37
builds enable JSON1).
"""

from __future__ import annotations

from dataclasses import dataclass

from qinglong_edge.contracts.digest import sha256

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
]

#: ``PRAGMA application_id`` of our databases ("QLED"); 0 means "not yet stamped".
APPLICATION_ID = 0x514C4544


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step.

    Attributes:
        version: 1, 2, 3... with no gaps.
        name: short stable name (``0001-projects-policy-audit``).
        statements: SQL statements run in order inside one ``BEGIN IMMEDIATE``.
    """

    version: int
    name: str
    statements: tuple[str, ...]

    @property
    def checksum(self) -> str:
        """SHA-256 (hex) of the name and statements, recorded when applied."""
        digest = sha256(self.name.encode("utf-8"))
        for statement in self.statements:
            digest.update(b"\x00" + statement.strip().encode("utf-8"))
        return digest.hexdigest()


#: Table created before any migration (in the same transaction as the first probe).
SCHEMA_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
  version INTEGER PRIMARY KEY NOT NULL CHECK (version >= 1),
  name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
  checksum TEXT NOT NULL CHECK (length(checksum) = 64 AND checksum NOT GLOB '*[^0-9a-f]*'),
  applied_at_ms INTEGER NOT NULL CHECK (applied_at_ms >= 0)
)
"""

#: The write probe's table: one row, rewritten by every open.
STORE_PROBE_DDL = """
CREATE TABLE IF NOT EXISTS store_probe (
  id INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
  pid INTEGER NOT NULL,
  probed_at_ms INTEGER NOT NULL CHECK (probed_at_ms >= 0)
)
"""

# Re-used CHECK fragments (SQL text, no user input).
_SUBJECT_TYPES = "('user','api_app','mcp_client','agent','system','worker')"
_CREDENTIAL_SUBJECT_TYPES = "('user','api_app','mcp_client','agent')"


def _key_id(column: str) -> str:
    """1-64 characters of ``[A-Za-z0-9._:-]`` (credential and pepper key ids)."""
    return f"length({column}) BETWEEN 1 AND 64 AND {column} NOT GLOB '*[^A-Za-z0-9._:-]*'"


def _hex64(column: str) -> str:
    return f"length({column}) = 64 AND {column} NOT GLOB '*[^0-9a-f]*'"


def _no_control(column: str) -> str:
    return f"{column} NOT GLOB '*[' || char(1) || '-' || char(31) || char(127) || ']*' AND instr({column}, char(0)) = 0"


_M1_PROJECTS_POLICY_AUDIT = (
    f"""
CREATE TABLE "QingLong3Projects" (
  id TEXT PRIMARY KEY NOT NULL,
  name TEXT NOT NULL,
  slug TEXT NOT NULL,
  status TEXT NOT NULL,
  version INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  CONSTRAINT ql3_local_projects_id_check CHECK (length(id) BETWEEN 1 AND 128 AND {_no_control("id")}),
  CONSTRAINT ql3_local_projects_name_check CHECK (length(name) BETWEEN 1 AND 255),
  CONSTRAINT ql3_local_projects_slug_check CHECK (
    length(slug) BETWEEN 1 AND 128 AND slug = lower(slug) AND slug NOT GLOB '*[^a-z0-9-]*'
    AND substr(slug, 1, 1) GLOB '[a-z0-9]' AND substr(slug, -1, 1) GLOB '[a-z0-9]'
  ),
  CONSTRAINT ql3_local_projects_status_check CHECK (status IN ('active', 'archived')),
  CONSTRAINT ql3_local_projects_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT ql3_local_projects_time_check CHECK (created_at_ms >= 0 AND updated_at_ms >= created_at_ms)
)
""",
    'CREATE UNIQUE INDEX ql3_local_projects_slug_uidx ON "QingLong3Projects" (slug)',
    """
INSERT INTO "QingLong3Projects" (id, name, slug, status, version, created_at_ms, updated_at_ms)
VALUES ('default', 'Default', 'default', 'active', 1, 0, 0)
""",
    f"""
CREATE TABLE "QingLong3ProjectRoleBindings" (
  project_id TEXT NOT NULL,
  subject_type TEXT NOT NULL,
  subject_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  state TEXT NOT NULL,
  role TEXT,
  mutation_id TEXT NOT NULL,
  changed_by_type TEXT NOT NULL,
  changed_by_id TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (project_id, subject_type, subject_id, version),
  FOREIGN KEY (project_id) REFERENCES "QingLong3Projects" (id) ON DELETE RESTRICT,
  CONSTRAINT ql3_local_bindings_subject_type_check CHECK (subject_type IN {_SUBJECT_TYPES}),
  CONSTRAINT ql3_local_bindings_subject_id_check CHECK (length(subject_id) BETWEEN 1 AND 255),
  CONSTRAINT ql3_local_bindings_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT ql3_local_bindings_state_role_check CHECK (
    (state = 'active' AND role IN ('owner', 'admin', 'operator', 'viewer'))
    OR (state = 'revoked' AND role IS NULL)
  ),
  CONSTRAINT ql3_local_bindings_mutation_check CHECK (length(mutation_id) BETWEEN 1 AND 64),
  CONSTRAINT ql3_local_bindings_changed_by_type_check CHECK (changed_by_type IN {_SUBJECT_TYPES}),
  CONSTRAINT ql3_local_bindings_changed_by_id_check CHECK (length(changed_by_id) BETWEEN 1 AND 255),
  CONSTRAINT ql3_local_bindings_created_check CHECK (created_at_ms >= 0)
)
""",
    """
CREATE UNIQUE INDEX ql3_local_bindings_mutation_uidx
ON "QingLong3ProjectRoleBindings" (project_id, subject_type, subject_id, mutation_id)
""",
    """
CREATE INDEX ql3_local_bindings_current_idx
ON "QingLong3ProjectRoleBindings" (project_id, subject_type, subject_id, version DESC)
""",
    'CREATE INDEX ql3_local_bindings_project_idx ON "QingLong3ProjectRoleBindings" (project_id, version DESC)',
    # No FOREIGN KEY on project_id: an unknown project is audited (spec README).
    f"""
CREATE TABLE "QingLong3SecurityAuditEvents" (
  event_id TEXT PRIMARY KEY NOT NULL,
  request_id TEXT NOT NULL,
  operation_id TEXT NOT NULL,
  project_id TEXT,
  subject_type TEXT,
  subject_id TEXT,
  authentication_id TEXT,
  outcome TEXT NOT NULL,
  reasons_json TEXT NOT NULL,
  fence_project_version INTEGER,
  fence_binding_version INTEGER,
  occurred_at_ms INTEGER NOT NULL,
  CONSTRAINT ql3_local_audit_event_check CHECK (length(event_id) = 36),
  CONSTRAINT ql3_local_audit_request_check CHECK (length(request_id) BETWEEN 1 AND 128),
  CONSTRAINT ql3_local_audit_operation_check CHECK (length(operation_id) BETWEEN 1 AND 128),
  CONSTRAINT ql3_local_audit_project_check CHECK (project_id IS NULL OR length(project_id) BETWEEN 1 AND 128),
  CONSTRAINT ql3_local_audit_subject_check CHECK (
    (subject_type IS NULL AND subject_id IS NULL AND authentication_id IS NULL)
    OR (
      subject_type IN {_SUBJECT_TYPES}
      AND length(subject_id) BETWEEN 1 AND 255
      AND length(authentication_id) BETWEEN 1 AND 128
    )
  ),
  CONSTRAINT ql3_local_audit_outcome_check CHECK (
    outcome IN ('authentication_rejected', 'authentication_unavailable', 'authorization_unavailable',
                'denied', 'approval_required', 'allowed')
  ),
  CONSTRAINT ql3_local_audit_reasons_check CHECK (
    json_valid(reasons_json) AND json_type(reasons_json) = 'array'
    AND json_array_length(reasons_json) BETWEEN 1 AND 8 AND length(reasons_json) <= 2048
  ),
  CONSTRAINT ql3_local_audit_fence_check CHECK (
    (fence_project_version IS NULL AND fence_binding_version IS NULL)
    OR (
      fence_project_version BETWEEN 1 AND 2147483647
      AND (fence_binding_version IS NULL OR fence_binding_version BETWEEN 1 AND 2147483647)
    )
  ),
  CONSTRAINT ql3_local_audit_time_check CHECK (occurred_at_ms >= 0)
)
""",
    """
CREATE INDEX ql3_local_audit_project_time_idx
ON "QingLong3SecurityAuditEvents" (project_id, occurred_at_ms DESC, event_id DESC)
""",
    """
CREATE INDEX ql3_local_audit_subject_time_idx
ON "QingLong3SecurityAuditEvents" (subject_type, subject_id, occurred_at_ms DESC, event_id DESC)
""",
)

_M2_IDENTITY_CREDENTIALS = (
    f"""
CREATE TABLE "QingLong3IdentitySubjects" (
  subject_type TEXT NOT NULL,
  subject_id TEXT NOT NULL,
  status TEXT NOT NULL,
  version INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (subject_type, subject_id),
  CONSTRAINT ql3_local_identity_type_check CHECK (subject_type IN {_SUBJECT_TYPES}),
  CONSTRAINT ql3_local_identity_id_check CHECK (length(subject_id) BETWEEN 1 AND 255),
  CONSTRAINT ql3_local_identity_status_check CHECK (status IN ('active', 'disabled')),
  CONSTRAINT ql3_local_identity_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT ql3_local_identity_time_check CHECK (created_at_ms >= 0 AND updated_at_ms >= created_at_ms)
)
""",
    """
CREATE INDEX ql3_local_identity_status_idx
ON "QingLong3IdentitySubjects" (status, subject_type, subject_id)
""",
    f"""
CREATE TABLE "QingLong3ApiCredentials" (
  credential_id TEXT NOT NULL,
  version INTEGER NOT NULL,
  state TEXT NOT NULL,
  subject_type TEXT NOT NULL,
  subject_id TEXT NOT NULL,
  secret_digest TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  not_before_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  PRIMARY KEY (credential_id, version),
  FOREIGN KEY (subject_type, subject_id)
    REFERENCES "QingLong3IdentitySubjects" (subject_type, subject_id) ON DELETE RESTRICT,
  CONSTRAINT ql3_local_credentials_id_check CHECK ({_key_id("credential_id")}),
  CONSTRAINT ql3_local_credentials_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT ql3_local_credentials_state_check CHECK (state IN ('active', 'revoked')),
  CONSTRAINT ql3_local_credentials_subject_type_check CHECK (subject_type IN {_CREDENTIAL_SUBJECT_TYPES}),
  CONSTRAINT ql3_local_credentials_subject_id_check CHECK (length(subject_id) BETWEEN 1 AND 255),
  CONSTRAINT ql3_local_credentials_digest_check CHECK ({_hex64("secret_digest")}),
  CONSTRAINT ql3_local_credentials_lifetime_check CHECK (
    created_at_ms >= 0 AND not_before_at_ms >= created_at_ms AND expires_at_ms > not_before_at_ms
  )
)
""",
    """
CREATE INDEX ql3_local_credentials_current_idx
ON "QingLong3ApiCredentials" (credential_id, version DESC)
""",
    """
CREATE INDEX ql3_local_credentials_subject_idx
ON "QingLong3ApiCredentials" (subject_type, subject_id, credential_id, version DESC)
""",
    f"""
CREATE TABLE "QingLong3LocalOwnerPepperKeys" (
  pepper_key_id TEXT PRIMARY KEY NOT NULL,
  material_digest TEXT,
  backup_digest TEXT,
  state TEXT NOT NULL,
  version INTEGER NOT NULL,
  register_mutation_id TEXT,
  activate_mutation_id TEXT,
  retire_mutation_id TEXT,
  registered_at_ms INTEGER NOT NULL,
  activated_at_ms INTEGER,
  retired_at_ms INTEGER,
  CONSTRAINT ql3_local_owner_pepper_key_id_check CHECK ({_key_id("pepper_key_id")}),
  CONSTRAINT ql3_local_owner_pepper_digest_check CHECK (
    (material_digest IS NULL AND backup_digest IS NULL)
    OR ({_hex64("material_digest")} AND {_hex64("backup_digest")})
  ),
  CONSTRAINT ql3_local_owner_pepper_state_check CHECK (
    state IN ('recovery_required', 'staged', 'active', 'retired')
  ),
  CONSTRAINT ql3_local_owner_pepper_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT ql3_local_owner_pepper_mutation_check CHECK (
    (register_mutation_id IS NULL OR length(register_mutation_id) = 36)
    AND (activate_mutation_id IS NULL OR length(activate_mutation_id) = 36)
    AND (retire_mutation_id IS NULL OR length(retire_mutation_id) = 36)
  ),
  CONSTRAINT ql3_local_owner_pepper_time_check CHECK (
    registered_at_ms >= 0
    AND (activated_at_ms IS NULL OR activated_at_ms >= registered_at_ms)
    AND (retired_at_ms IS NULL OR retired_at_ms >= activated_at_ms)
  ),
  CONSTRAINT ql3_local_owner_pepper_shape_check CHECK (
    (state = 'recovery_required' AND material_digest IS NULL AND register_mutation_id IS NULL
      AND activate_mutation_id IS NULL AND retire_mutation_id IS NULL
      AND activated_at_ms IS NULL AND retired_at_ms IS NULL)
    OR (state = 'staged' AND material_digest IS NOT NULL AND register_mutation_id IS NOT NULL
      AND activate_mutation_id IS NULL AND retire_mutation_id IS NULL
      AND activated_at_ms IS NULL AND retired_at_ms IS NULL)
    OR (state = 'active' AND material_digest IS NOT NULL AND register_mutation_id IS NOT NULL
      AND activate_mutation_id IS NOT NULL AND retire_mutation_id IS NULL
      AND activated_at_ms IS NOT NULL AND retired_at_ms IS NULL)
    OR (state = 'retired' AND material_digest IS NOT NULL AND register_mutation_id IS NOT NULL
      AND activate_mutation_id IS NOT NULL AND retire_mutation_id IS NOT NULL
      AND activated_at_ms IS NOT NULL AND retired_at_ms IS NOT NULL)
  )
)
""",
    """
CREATE UNIQUE INDEX ql3_local_owner_pepper_register_mutation_uidx
ON "QingLong3LocalOwnerPepperKeys" (register_mutation_id) WHERE register_mutation_id IS NOT NULL
""",
    """
CREATE UNIQUE INDEX ql3_local_owner_pepper_single_active_uidx
ON "QingLong3LocalOwnerPepperKeys" (state) WHERE state = 'active'
""",
    'CREATE INDEX ql3_local_owner_pepper_state_idx ON "QingLong3LocalOwnerPepperKeys" (state, pepper_key_id)',
    f"""
CREATE TABLE "QingLong3LocalOwnerPepperActivations" (
  generation INTEGER PRIMARY KEY NOT NULL,
  mutation_id TEXT NOT NULL,
  expected_generation INTEGER NOT NULL,
  previous_pepper_key_id TEXT,
  active_pepper_key_id TEXT NOT NULL,
  material_digest TEXT NOT NULL,
  backup_digest TEXT NOT NULL,
  activated_at_ms INTEGER NOT NULL,
  CONSTRAINT ql3_local_owner_pepper_activation_generation_check CHECK (
    generation BETWEEN 1 AND 2147483647 AND expected_generation = generation - 1
  ),
  CONSTRAINT ql3_local_owner_pepper_activation_mutation_check CHECK (length(mutation_id) = 36),
  CONSTRAINT ql3_local_owner_pepper_activation_key_check CHECK (
    {_key_id("active_pepper_key_id")}
    AND (previous_pepper_key_id IS NULL OR (
      {_key_id("previous_pepper_key_id")} AND previous_pepper_key_id <> active_pepper_key_id
    ))
  ),
  CONSTRAINT ql3_local_owner_pepper_activation_digest_check CHECK (
    {_hex64("material_digest")} AND {_hex64("backup_digest")}
  ),
  CONSTRAINT ql3_local_owner_pepper_activation_time_check CHECK (activated_at_ms >= 0),
  FOREIGN KEY (previous_pepper_key_id)
    REFERENCES "QingLong3LocalOwnerPepperKeys" (pepper_key_id) ON DELETE RESTRICT,
  FOREIGN KEY (active_pepper_key_id)
    REFERENCES "QingLong3LocalOwnerPepperKeys" (pepper_key_id) ON DELETE RESTRICT
)
""",
    """
CREATE UNIQUE INDEX ql3_local_owner_pepper_activation_mutation_uidx
ON "QingLong3LocalOwnerPepperActivations" (mutation_id)
""",
    """
CREATE INDEX ql3_local_owner_pepper_activation_key_idx
ON "QingLong3LocalOwnerPepperActivations" (active_pepper_key_id, generation DESC)
""",
    f"""
CREATE TABLE "QingLong3ApiCredentialPepperBindings" (
  credential_id TEXT NOT NULL,
  credential_version INTEGER NOT NULL,
  pepper_key_id TEXT NOT NULL,
  PRIMARY KEY (credential_id, credential_version),
  FOREIGN KEY (credential_id, credential_version)
    REFERENCES "QingLong3ApiCredentials" (credential_id, version) ON DELETE RESTRICT,
  FOREIGN KEY (pepper_key_id)
    REFERENCES "QingLong3LocalOwnerPepperKeys" (pepper_key_id) ON DELETE RESTRICT,
  CONSTRAINT ql3_local_credential_pepper_key_id_check CHECK ({_key_id("pepper_key_id")})
)
""",
    """
CREATE INDEX ql3_local_credential_pepper_key_idx
ON "QingLong3ApiCredentialPepperBindings" (pepper_key_id, credential_id, credential_version)
""",
)

_M3_RUN_CORE = (
    """
CREATE TABLE "Runs" (
  id TEXT PRIMARY KEY NOT NULL,
  project_id TEXT NOT NULL,
  task_id TEXT NOT NULL,
  task_revision TEXT NOT NULL,
  task_name TEXT,
  task_snapshot_ref TEXT,
  legacy_cron_id INTEGER,
  parent_run_id TEXT,
  retry_of_run_id TEXT,
  trigger_id TEXT,
  trigger_type TEXT NOT NULL,
  execution_origin TEXT NOT NULL
    CONSTRAINT ql3_local_runs_execution_origin_check
    CHECK (execution_origin IN ('manual', 'scheduled_system', 'scheduled_node', 'once', 'boot', 'grpc',
                                'subscription', 'system', 'script', 'legacy_import')),
  execution_owner TEXT NOT NULL
    CONSTRAINT ql3_local_runs_execution_owner_check CHECK (execution_owner IN ('legacy', 'runtime')),
  triggered_by TEXT,
  request_id TEXT,
  scheduled_for_ms INTEGER,
  status TEXT NOT NULL
    CONSTRAINT ql3_local_runs_status_check
    CHECK (status IN ('created', 'queued', 'dispatching', 'running', 'waiting_approval', 'retry_wait', 'lost',
                      'succeeded', 'failed', 'cancelled', 'timed_out')),
  version INTEGER NOT NULL DEFAULT 0 CONSTRAINT ql3_local_runs_version_check CHECK (version >= 0),
  event_sequence INTEGER NOT NULL DEFAULT 0
    CONSTRAINT ql3_local_runs_event_sequence_check CHECK (event_sequence >= 0),
  priority INTEGER NOT NULL DEFAULT 0,
  idempotency_key TEXT,
  input_ref TEXT,
  output_ref TEXT,
  created_at_ms INTEGER NOT NULL,
  queued_at_ms INTEGER,
  started_at_ms INTEGER,
  finished_at_ms INTEGER,
  cancel_requested_at_ms INTEGER,
  cancel_reason TEXT
    CONSTRAINT ql3_local_runs_cancel_reason_check
    CHECK (cancel_reason IS NULL OR cancel_reason IN ('user', 'policy', 'shutdown', 'reconcile', 'timeout')),
  error_code TEXT,
  error_summary TEXT,
  CONSTRAINT ql3_local_runs_time_check CHECK (
    created_at_ms >= 0
    AND (scheduled_for_ms IS NULL OR scheduled_for_ms >= 0)
    AND (queued_at_ms IS NULL OR queued_at_ms >= 0)
    AND (started_at_ms IS NULL OR started_at_ms >= 0)
    AND (finished_at_ms IS NULL OR finished_at_ms >= 0)
    AND (cancel_requested_at_ms IS NULL OR cancel_requested_at_ms >= 0)
  ),
  CONSTRAINT ql3_local_runs_parent_fk FOREIGN KEY (parent_run_id) REFERENCES "Runs" (id),
  CONSTRAINT ql3_local_runs_retry_fk FOREIGN KEY (retry_of_run_id) REFERENCES "Runs" (id)
)
""",
    """
CREATE UNIQUE INDEX ql3_local_runs_project_idempotency_uidx
ON "Runs" (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL
""",
    'CREATE INDEX ql3_local_runs_project_created_idx ON "Runs" (project_id, created_at_ms, id)',
    'CREATE INDEX ql3_local_runs_task_created_idx ON "Runs" (task_id, created_at_ms, id)',
    'CREATE INDEX ql3_local_runs_cancel_requested_idx ON "Runs" (status, cancel_requested_at_ms, id)',
    'CREATE INDEX ql3_local_runs_lost_retry_idx ON "Runs" (execution_owner, status, id)',
    """
CREATE TABLE "RunAttempts" (
  id TEXT PRIMARY KEY NOT NULL,
  run_id TEXT NOT NULL,
  step_run_id TEXT,
  attempt INTEGER NOT NULL CONSTRAINT ql3_local_attempts_attempt_check CHECK (attempt >= 1),
  status TEXT NOT NULL
    CONSTRAINT ql3_local_attempts_status_check
    CHECK (status IN ('claimed', 'starting', 'running', 'succeeded', 'failed', 'cancelled', 'timed_out', 'lost')),
  executor_type TEXT NOT NULL,
  worker_id TEXT,
  worker_session_id TEXT,
  worker_generation INTEGER,
  executor_handle TEXT,
  pid INTEGER,
  log_artifact_id TEXT,
  lease_token TEXT,
  lease_token_digest TEXT,
  lease_generation INTEGER,
  lease_version INTEGER,
  lease_expires_at_ms INTEGER,
  offer_id TEXT,
  deadline_at_ms INTEGER,
  callback_token_hash TEXT,
  callback_sequence INTEGER NOT NULL DEFAULT 0
    CONSTRAINT ql3_local_attempts_callback_sequence_check CHECK (callback_sequence >= 0),
  created_at_ms INTEGER NOT NULL,
  started_at_ms INTEGER,
  finished_at_ms INTEGER,
  exit_code INTEGER,
  error_code TEXT,
  error_summary TEXT,
  CONSTRAINT ql3_local_attempts_time_check CHECK (
    created_at_ms >= 0
    AND (started_at_ms IS NULL OR started_at_ms >= 0)
    AND (finished_at_ms IS NULL OR finished_at_ms >= 0)
    AND (lease_expires_at_ms IS NULL OR lease_expires_at_ms >= 0)
    AND (deadline_at_ms IS NULL OR deadline_at_ms >= 0)
  ),
  CONSTRAINT ql3_local_attempts_run_fk FOREIGN KEY (run_id) REFERENCES "Runs" (id) ON DELETE CASCADE
)
""",
    'CREATE UNIQUE INDEX ql3_local_attempts_run_attempt_uidx ON "RunAttempts" (run_id, attempt)',
    'CREATE INDEX ql3_local_attempts_run_status_idx ON "RunAttempts" (run_id, status, id)',
    'CREATE INDEX ql3_local_attempts_lease_idx ON "RunAttempts" (lease_expires_at_ms, id)',
    'CREATE INDEX ql3_local_attempts_deadline_idx ON "RunAttempts" (status, deadline_at_ms, id)',
    """
CREATE TABLE "RunEvents" (
  id TEXT PRIMARY KEY NOT NULL,
  run_id TEXT NOT NULL,
  sequence INTEGER NOT NULL CONSTRAINT ql3_local_events_sequence_check CHECK (sequence >= 1),
  type TEXT NOT NULL,
  dedupe_key TEXT,
  actor_type TEXT NOT NULL
    CONSTRAINT ql3_local_events_actor_type_check
    CHECK (actor_type IN ('user', 'api_app', 'trigger', 'agent', 'mcp_client', 'worker', 'executor', 'system',
                          'legacy_shell', 'scheduler', 'reconciler', 'compatibility')),
  actor_id TEXT,
  attempt_id TEXT,
  step_run_id TEXT,
  payload TEXT NOT NULL
    CONSTRAINT ql3_local_events_payload_check CHECK (json_valid(payload) AND json_type(payload) = 'object'),
  created_at_ms INTEGER NOT NULL CONSTRAINT ql3_local_events_created_at_check CHECK (created_at_ms >= 0),
  CONSTRAINT ql3_local_events_run_fk FOREIGN KEY (run_id) REFERENCES "Runs" (id) ON DELETE CASCADE,
  CONSTRAINT ql3_local_events_attempt_fk FOREIGN KEY (attempt_id) REFERENCES "RunAttempts" (id) ON DELETE SET NULL
)
""",
    'CREATE UNIQUE INDEX ql3_local_events_run_sequence_uidx ON "RunEvents" (run_id, sequence)',
    """
CREATE UNIQUE INDEX ql3_local_events_run_dedupe_uidx
ON "RunEvents" (run_id, dedupe_key) WHERE dedupe_key IS NOT NULL
""",
    'CREATE INDEX ql3_local_events_run_created_idx ON "RunEvents" (run_id, created_at_ms, id)',
    """
CREATE TABLE "StepRuns" (
  id TEXT PRIMARY KEY NOT NULL,
  run_id TEXT NOT NULL,
  parent_step_run_id TEXT,
  step_key TEXT NOT NULL,
  kind TEXT NOT NULL,
  definition_ref TEXT NOT NULL,
  definition_digest TEXT NOT NULL,
  required INTEGER NOT NULL,
  status TEXT NOT NULL,
  version INTEGER NOT NULL,
  attempt_count INTEGER NOT NULL,
  input_ref TEXT,
  output_ref TEXT,
  approval_request_id TEXT,
  ready_at_ms INTEGER,
  started_at_ms INTEGER,
  finished_at_ms INTEGER,
  result_code TEXT,
  error_summary TEXT,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  last_mutation_id TEXT NOT NULL,
  step_run_digest TEXT NOT NULL,
  step_run_json TEXT NOT NULL,
  CONSTRAINT ql3_step_runs_run_fk FOREIGN KEY (run_id) REFERENCES "Runs" (id) ON DELETE CASCADE,
  CONSTRAINT ql3_step_runs_parent_fk
    FOREIGN KEY (run_id, parent_step_run_id) REFERENCES "StepRuns" (run_id, id) ON DELETE RESTRICT,
  CONSTRAINT ql3_step_runs_identity_check CHECK (
    length(id) BETWEEN 1 AND 128 AND length(run_id) BETWEEN 1 AND 128
    AND (parent_step_run_id IS NULL OR (length(parent_step_run_id) BETWEEN 1 AND 128 AND parent_step_run_id <> id))
    AND length(step_key) BETWEEN 1 AND 128
    AND length(CAST(definition_ref AS BLOB)) BETWEEN 1 AND 512
  ),
  CONSTRAINT ql3_step_runs_kind_check CHECK (
    kind IN ('task', 'tool', 'model', 'agent', 'condition', 'approval', 'subworkflow')
  ),
  CONSTRAINT ql3_step_runs_status_check CHECK (
    status IN ('pending', 'ready', 'waiting_approval', 'running', 'lost', 'succeeded', 'failed', 'skipped',
               'cancelled', 'timed_out')
  ),
  CONSTRAINT ql3_step_runs_digest_check CHECK (
    length(definition_digest) = 64 AND definition_digest NOT GLOB '*[^0-9a-f]*'
    AND length(step_run_digest) = 64 AND step_run_digest NOT GLOB '*[^0-9a-f]*'
  ),
  CONSTRAINT ql3_step_runs_counter_check CHECK (
    required IN (0, 1) AND version BETWEEN 1 AND 2147483647 AND attempt_count BETWEEN 0 AND 64
  ),
  CONSTRAINT ql3_step_runs_reference_check CHECK (
    (input_ref IS NULL OR length(CAST(input_ref AS BLOB)) BETWEEN 1 AND 512)
    AND (output_ref IS NULL OR length(CAST(output_ref AS BLOB)) BETWEEN 1 AND 512)
    AND (approval_request_id IS NULL OR length(approval_request_id) BETWEEN 1 AND 128)
  ),
  CONSTRAINT ql3_step_runs_time_check CHECK (
    created_at_ms >= 0 AND updated_at_ms >= created_at_ms
    AND (ready_at_ms IS NULL OR ready_at_ms BETWEEN created_at_ms AND updated_at_ms)
    AND (started_at_ms IS NULL OR (ready_at_ms IS NOT NULL AND started_at_ms BETWEEN ready_at_ms AND updated_at_ms))
    AND (finished_at_ms IS NULL OR (
      finished_at_ms BETWEEN created_at_ms AND updated_at_ms
      AND (ready_at_ms IS NULL OR finished_at_ms >= ready_at_ms)
      AND (started_at_ms IS NULL OR finished_at_ms >= started_at_ms)
    ))
  ),
  CONSTRAINT ql3_step_runs_state_shape_check CHECK (
    (status = 'pending' AND ready_at_ms IS NULL AND started_at_ms IS NULL AND finished_at_ms IS NULL)
    OR (status IN ('ready', 'waiting_approval') AND ready_at_ms IS NOT NULL AND started_at_ms IS NULL
        AND finished_at_ms IS NULL)
    OR (status IN ('running', 'lost') AND ready_at_ms IS NOT NULL AND started_at_ms IS NOT NULL
        AND finished_at_ms IS NULL)
    OR (status IN ('succeeded', 'failed', 'skipped', 'cancelled', 'timed_out') AND finished_at_ms IS NOT NULL)
  ),
  CONSTRAINT ql3_step_runs_result_shape_check CHECK (
    status <> 'waiting_approval' OR approval_request_id IS NOT NULL
  ),
  CONSTRAINT ql3_step_runs_result_value_check CHECK (
    (output_ref IS NULL OR status = 'succeeded')
    AND (
      (status = 'succeeded' AND result_code IS NULL AND error_summary IS NULL)
      OR (status IN ('failed', 'skipped', 'cancelled', 'timed_out', 'lost') AND result_code IS NOT NULL)
      OR (status IN ('pending', 'ready', 'waiting_approval', 'running') AND result_code IS NULL
          AND error_summary IS NULL)
    )
    AND (result_code IS NULL OR (
      length(result_code) BETWEEN 1 AND 64 AND result_code NOT GLOB '*[^a-z0-9_]*'
      AND substr(result_code, 1, 1) GLOB '[a-z]'
    ))
    AND (error_summary IS NULL OR length(CAST(error_summary AS BLOB)) BETWEEN 1 AND 2048)
  ),
  CONSTRAINT ql3_step_runs_mutation_identity_check CHECK (length(last_mutation_id) BETWEEN 1 AND 128),
  CONSTRAINT ql3_step_runs_json_check CHECK (
    length(CAST(step_run_json AS BLOB)) BETWEEN 2 AND 16384
    AND json_valid(step_run_json) AND json_type(step_run_json) = 'object'
    AND json_extract(step_run_json, '$.schema') = 'qinglong/step-run@v1'
    AND json_extract(step_run_json, '$.id') = id
    AND json_extract(step_run_json, '$.runId') = run_id
    AND json_extract(step_run_json, '$.parentStepRunId') IS parent_step_run_id
    AND json_extract(step_run_json, '$.stepKey') = step_key
    AND json_extract(step_run_json, '$.kind') = kind
    AND json_extract(step_run_json, '$.definitionRef') = definition_ref
    AND json_extract(step_run_json, '$.definitionDigest') = definition_digest
    AND json_extract(step_run_json, '$.required') IS required
    AND json_extract(step_run_json, '$.status') = status
    AND json_extract(step_run_json, '$.version') = version
    AND json_extract(step_run_json, '$.attemptCount') IS attempt_count
    AND json_extract(step_run_json, '$.inputRef') IS input_ref
    AND json_extract(step_run_json, '$.outputRef') IS output_ref
    AND json_extract(step_run_json, '$.approvalRequestId') IS approval_request_id
    AND json_extract(step_run_json, '$.readyAtMs') IS ready_at_ms
    AND json_extract(step_run_json, '$.startedAtMs') IS started_at_ms
    AND json_extract(step_run_json, '$.finishedAtMs') IS finished_at_ms
    AND json_extract(step_run_json, '$.resultCode') IS result_code
    AND json_extract(step_run_json, '$.errorSummary') IS error_summary
    AND json_extract(step_run_json, '$.createdAtMs') IS created_at_ms
    AND json_extract(step_run_json, '$.updatedAtMs') IS updated_at_ms
    AND json_extract(step_run_json, '$.lastMutationId') = last_mutation_id
    AND json_extract(step_run_json, '$.stepRunDigest') = step_run_digest
  )
)
""",
    'CREATE UNIQUE INDEX ql3_step_runs_run_id_uidx ON "StepRuns" (run_id, id)',
    'CREATE UNIQUE INDEX ql3_step_runs_run_step_uidx ON "StepRuns" (run_id, step_key)',
    'CREATE INDEX ql3_step_runs_run_status_idx ON "StepRuns" (run_id, status, id)',
    """
CREATE INDEX ql3_step_runs_recovery_idx ON "StepRuns" (status, updated_at_ms, id)
WHERE status IN ('waiting_approval', 'running', 'lost')
""",
    """
CREATE TABLE "StepRunMutations" (
  mutation_id TEXT PRIMARY KEY NOT NULL,
  mutation_digest TEXT NOT NULL,
  run_id TEXT NOT NULL,
  step_run_id TEXT NOT NULL,
  step_run_digest TEXT NOT NULL,
  event_id TEXT NOT NULL,
  event_sequence INTEGER NOT NULL,
  run_version INTEGER NOT NULL,
  step_run_json TEXT NOT NULL,
  committed_at_ms INTEGER NOT NULL,
  CONSTRAINT ql3_step_run_mutations_step_fk
    FOREIGN KEY (run_id, step_run_id) REFERENCES "StepRuns" (run_id, id) ON DELETE CASCADE,
  CONSTRAINT ql3_step_run_mutations_event_fk FOREIGN KEY (event_id) REFERENCES "RunEvents" (id) ON DELETE CASCADE,
  CONSTRAINT ql3_step_run_mutations_identity_check CHECK (
    length(mutation_id) BETWEEN 1 AND 128 AND length(run_id) BETWEEN 1 AND 128
    AND length(step_run_id) BETWEEN 1 AND 128 AND length(event_id) BETWEEN 1 AND 128
  ),
  CONSTRAINT ql3_step_run_mutations_digest_check CHECK (
    length(mutation_digest) = 64 AND mutation_digest NOT GLOB '*[^0-9a-f]*'
    AND length(step_run_digest) = 64 AND step_run_digest NOT GLOB '*[^0-9a-f]*'
  ),
  CONSTRAINT ql3_step_run_mutations_counter_check CHECK (
    event_sequence BETWEEN 1 AND 2147483647 AND run_version BETWEEN 1 AND 2147483647 AND committed_at_ms >= 0
  ),
  CONSTRAINT ql3_step_run_mutations_json_check CHECK (
    length(CAST(step_run_json AS BLOB)) BETWEEN 2 AND 16384
    AND json_valid(step_run_json) AND json_type(step_run_json) = 'object'
    AND json_extract(step_run_json, '$.schema') = 'qinglong/step-run@v1'
    AND json_extract(step_run_json, '$.id') = step_run_id
    AND json_extract(step_run_json, '$.runId') = run_id
    AND json_extract(step_run_json, '$.lastMutationId') = mutation_id
    AND json_extract(step_run_json, '$.stepRunDigest') = step_run_digest
  )
)
""",
    'CREATE UNIQUE INDEX ql3_step_run_mutations_event_uidx ON "StepRunMutations" (event_id)',
    """
CREATE INDEX ql3_step_run_mutations_step_idx
ON "StepRunMutations" (run_id, step_run_id, event_sequence, mutation_id)
""",
)

# Our Local task definitions (the spec has no Local task tables). A task head points at
# its current revision; revisions are immutable. The head -> revision foreign key is
# DEFERRABLE so a new task's head and first revision go in in one transaction.
_M4_LOCAL_TASKS = (
    f"""
CREATE TABLE "QingLongEdgeTasks" (
  project_id TEXT NOT NULL,
  id TEXT NOT NULL,
  name TEXT NOT NULL,
  status TEXT NOT NULL,
  current_revision INTEGER NOT NULL,
  version INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (project_id, id),
  FOREIGN KEY (project_id) REFERENCES "QingLong3Projects" (id) ON DELETE RESTRICT,
  FOREIGN KEY (project_id, id, current_revision)
    REFERENCES "QingLongEdgeTaskRevisions" (project_id, task_id, revision)
    ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED,
  CONSTRAINT qle_tasks_id_check CHECK (
    length(id) BETWEEN 1 AND 128 AND substr(id, 1, 1) GLOB '[A-Za-z0-9]' AND id NOT GLOB '*[^A-Za-z0-9._:-]*'
  ),
  CONSTRAINT qle_tasks_name_check CHECK (length(name) BETWEEN 1 AND 255 AND {_no_control("name")}),
  CONSTRAINT qle_tasks_status_check CHECK (status IN ('active', 'disabled')),
  CONSTRAINT qle_tasks_revision_check CHECK (current_revision BETWEEN 1 AND 2147483647),
  CONSTRAINT qle_tasks_version_check CHECK (version BETWEEN 1 AND 2147483647),
  CONSTRAINT qle_tasks_time_check CHECK (created_at_ms >= 0 AND updated_at_ms >= created_at_ms)
)
""",
    'CREATE INDEX qle_tasks_status_idx ON "QingLongEdgeTasks" (project_id, status, id)',
    f"""
CREATE TABLE "QingLongEdgeTaskRevisions" (
  project_id TEXT NOT NULL,
  task_id TEXT NOT NULL,
  revision INTEGER NOT NULL,
  content_digest TEXT NOT NULL,
  definition_json TEXT NOT NULL,
  executable INTEGER NOT NULL,
  mutation_id TEXT NOT NULL,
  created_by_type TEXT NOT NULL,
  created_by_id TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (project_id, task_id, revision),
  FOREIGN KEY (project_id, task_id) REFERENCES "QingLongEdgeTasks" (project_id, id)
    ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED,
  CONSTRAINT qle_task_revisions_revision_check CHECK (revision BETWEEN 1 AND 2147483647),
  CONSTRAINT qle_task_revisions_digest_check CHECK ({_hex64("content_digest")}),
  CONSTRAINT qle_task_revisions_definition_check CHECK (
    json_valid(definition_json) AND json_type(definition_json) = 'object'
    AND length(CAST(definition_json AS BLOB)) BETWEEN 2 AND 65536
  ),
  CONSTRAINT qle_task_revisions_executable_check CHECK (executable IN (0, 1)),
  CONSTRAINT qle_task_revisions_mutation_check CHECK (length(mutation_id) BETWEEN 1 AND 128),
  CONSTRAINT qle_task_revisions_created_by_check CHECK (
    created_by_type IN {_SUBJECT_TYPES} AND length(created_by_id) BETWEEN 1 AND 255
  ),
  CONSTRAINT qle_task_revisions_time_check CHECK (created_at_ms >= 0)
)
""",
    """
CREATE UNIQUE INDEX qle_task_revisions_mutation_uidx
ON "QingLongEdgeTaskRevisions" (project_id, task_id, mutation_id)
""",
)

# Summary rows of refused requests (issue 16 item 2): the count and the interval start.
_M5_AUDIT_REFUSAL_SUMMARIES = (
    """
ALTER TABLE "QingLong3SecurityAuditEvents" ADD COLUMN refused_count INTEGER
  CONSTRAINT ql3_local_audit_refused_count_check CHECK (
    refused_count IS NULL OR refused_count BETWEEN 1 AND 9007199254740991
  )
""",
    """
ALTER TABLE "QingLong3SecurityAuditEvents" ADD COLUMN refused_since_ms INTEGER
  CONSTRAINT ql3_local_audit_refused_since_check CHECK (
    (refused_since_ms IS NULL) = (refused_count IS NULL)
    AND (refused_since_ms IS NULL OR refused_since_ms BETWEEN 0 AND occurred_at_ms)
  )
""",
)

# Tombstones of Run logs removed by ``execution.maxTotalLogBytes`` (issue 26): run.log.read
# answers a pruned log 410 ``retired`` with when it went and the size it had, not a
# 202 ``pending`` (its ``log_artifact_id`` is cleared) that a follower would poll forever.
# Deleted with the Run (retention_rows.delete_runs); at most one per attempt.
_M6_LOG_RETIREMENTS = (
    """
CREATE TABLE "QingLongEdgeLogRetirements" (
  attempt_id TEXT PRIMARY KEY NOT NULL,
  run_id TEXT NOT NULL,
  log_artifact_id TEXT NOT NULL,
  byte_length INTEGER NOT NULL,
  retired_at_ms INTEGER NOT NULL,
  CONSTRAINT qle_log_retirements_artifact_check CHECK (
    length(log_artifact_id) BETWEEN 1 AND 128 AND log_artifact_id NOT GLOB '*[^A-Za-z0-9._:-]*'
  ),
  CONSTRAINT qle_log_retirements_values_check CHECK (
    byte_length BETWEEN 0 AND 9007199254740991 AND retired_at_ms BETWEEN 0 AND 9007199254740991
  )
)
""",
    'CREATE INDEX qle_log_retirements_run_idx ON "QingLongEdgeLogRetirements" (run_id)',
)

# Local Run deadlines on the boot clock (issue 23; spec README "Decisions for clocks"):
# ``deadline_boot_ms`` is CLOCK_BOOTTIME ms of the boot ``deadline_boot_id`` names, the
# timer the controller uses in that boot (a wall-clock step cannot time a Run out);
# ``deadline_at_ms`` (wall clock) stays for display and is the deadline after a reboot.
_M7_DEADLINE_BOOT_CLOCK = (
    """
ALTER TABLE "RunAttempts" ADD COLUMN deadline_boot_ms INTEGER
  CONSTRAINT qle_attempts_deadline_boot_check CHECK (deadline_boot_ms IS NULL OR deadline_boot_ms >= 0)
""",
    """
ALTER TABLE "RunAttempts" ADD COLUMN deadline_boot_id TEXT
  CONSTRAINT qle_attempts_deadline_boot_id_check CHECK (
    (deadline_boot_id IS NULL) = (deadline_boot_ms IS NULL)
    AND (deadline_boot_id IS NULL OR length(deadline_boot_id) BETWEEN 1 AND 64)
  )
""",
)

#: Every migration, in order. Append only.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "0001-projects-policy-audit", _M1_PROJECTS_POLICY_AUDIT),
    Migration(2, "0002-identity-credentials-pepper", _M2_IDENTITY_CREDENTIALS),
    Migration(3, "0003-run-core-step-runs", _M3_RUN_CORE),
    Migration(4, "0004-local-tasks", _M4_LOCAL_TASKS),
    Migration(5, "0005-audit-refusal-summaries", _M5_AUDIT_REFUSAL_SUMMARIES),
    Migration(6, "0006-log-retirements", _M6_LOG_RETIREMENTS),
    Migration(7, "0007-deadline-boot-clock", _M7_DEADLINE_BOOT_CLOCK),
)

#: The schema version this code writes and understands (the last migration's version).
SCHEMA_VERSION = MIGRATIONS[-1].version
