"""The execution side of the cluster double: the seven routes after an offer is accepted
and the control surface tests and the demo drive it with (tests and the demo only).

Routes (remote-execution.md 3; each module says what it checks and which reference file
it follows):

==============  =========================================  ==================================
op              module                                     409 code
==============  =========================================  ==================================
starting        :mod:`tests.support.cluster_activation`    ``worker_activation_fenced``
start-failure   :mod:`tests.support.cluster_activation`    ``worker_activation_fenced``
running         :mod:`tests.support.cluster_activation`    ``worker_activation_fenced``
secrets         :mod:`tests.support.cluster_secrets`       ``worker_secret_delivery_fenced``
lease-control   :mod:`tests.support.cluster_activation`    ``worker_lease_control_fenced``
artifacts       :mod:`tests.support.cluster_completion`    ``worker_completion_fenced``
completion      :mod:`tests.support.cluster_completion`    ``worker_completion_fenced``
==============  =========================================  ==================================

The rows they act on are in :mod:`tests.support.cluster_attempts`. :class:`Executions`
is what :class:`~tests.support.cluster_state.ClusterState` holds as ``state.execution``;
the test-facing methods are re-exported by :class:`~tests.support.cluster_double.ClusterDouble`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.support import cluster_activation, cluster_completion, cluster_secrets
from tests.support.cluster_attempts import Attempt, Event, FenceRecord, Ledger, StoredArtifact

__all__ = ["EXECUTION_OPS", "Executions"]

#: The JSON routes this module answers (``artifacts`` is a stream: :meth:`Executions.upload`).
EXECUTION_OPS = ("starting", "start-failure", "running", "secrets", "lease-control", "completion")
_ROUTES = {
    "starting": cluster_activation.starting,
    "start-failure": cluster_activation.start_failure,
    "running": cluster_activation.running,
    "lease-control": cluster_activation.lease_control,
    "secrets": cluster_secrets.secrets,
    "completion": cluster_completion.complete,
}


class Executions(Ledger):
    """Attempts, artifacts, secrets and fences of one double, plus its control surface.

    Every method takes ``state.lock`` (re-entrant), so tests may call them while the TLS
    server runs.
    """

    # -- the routes -----------------------------------------------------------------------

    def handle(self, op: str, worker_id: str, session_id: str, document: object) -> dict[str, Any]:
        """Answer a JSON execution route (``op`` in :data:`EXECUTION_OPS`)."""
        with self.state.lock:
            self.sync()
            return _ROUTES[op](self, worker_id, session_id, document)

    def upload(self, worker_id: str, session_id: str, headers: tuple[tuple[str, str], ...], body: bytes | None, *,
               complete: bool = True) -> dict[str, Any]:
        """Answer the artifact stream (see :func:`tests.support.cluster_completion.upload`)."""
        with self.state.lock:
            self.sync()
            return cluster_completion.upload(self, worker_id, session_id, headers, body, complete=complete)

    # -- set-up ---------------------------------------------------------------------------

    def define_secret(self, name: str, value: str, *, project_id: str = "project-1",
                      version: int | None = None) -> str:
        """A project secret the secrets route can deliver; returns its ``qlsecret:v1:`` ref."""
        with self.state.lock:
            return cluster_secrets.define_secret(self, name, value, project_id=project_id, version=version)

    def define_environment_bundle(self, name: str, entries: Mapping[str, str], *, project_id: str = "project-1",
                                  version: int = 1) -> str:
        """An environment bundle (``qinglong/environment-bundle@v1``); returns its ref."""
        with self.state.lock:
            return cluster_secrets.define_bundle(self, name, entries, project_id=project_id, version=version)

    # -- control ----------------------------------------------------------------------------

    def request_cancel(self, run_id: str, reason: str = "user") -> str:
        """Record a cancel intent (``accepted`` / ``already_requested`` / ``already_terminal``);
        the worker learns it as ``stop_requested{reason}`` at its next lease-control."""
        with self.state.lock:
            return cluster_activation.request_cancel(self, run_id, reason)

    # -- inspection ---------------------------------------------------------------------------

    def attempt(self, run_id: str | None = None, *, attempt_id: str | None = None,
                offer_id: str | None = None) -> Attempt:
        """The live attempt row (KeyError when none matches; None arguments match any)."""
        with self.state.lock:
            return self.find(run_id, attempt_id=attempt_id, offer_id=offer_id)

    def events(self, run_id: str) -> list[Event]:
        with self.state.lock:
            return list(self.find(run_id).events)

    def artifact(self, run_id: str) -> StoredArtifact | None:
        """The stored log of the run's attempt, or None before an upload."""
        with self.state.lock:
            attempt = self.find(run_id)
            for key, stored in self.artifacts.items():
                if key[1:3] == (attempt.run_id, attempt.attempt_id):
                    return stored
            return None

    def fence_reasons(self, op: str | None = None) -> list[FenceRecord]:
        with self.state.lock:
            return [record for record in self.fences if op is None or record.op == op]

    def snapshot(self) -> dict[str, Any]:
        """Every attempt's :meth:`~tests.support.cluster_attempts.Attempt.view` by runId, with
        its artifact's metadata (no bytes, no token, no secret value)."""
        with self.state.lock:
            self.sync()
            out: dict[str, Any] = {}
            for attempt in self.attempts.values():
                view = attempt.view()
                stored = self.artifact(attempt.run_id)
                view["artifact"] = None if stored is None else {
                    "logArtifactId": stored.log_artifact_id, "byteLength": stored.byte_length,
                    "sha256": stored.sha256, "truncated": stored.truncated}
                out[attempt.run_id] = view
            return out
