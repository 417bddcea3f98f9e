"""``qinglong-edge serve``: the Local API (ADR-0372) in the foreground, for procd/systemd.

Steps: load the configuration (its ``localApi`` section is required: exit 78 without
it), refuse to go on without the pepper keys the database names (exit 73
``keyring_missing``: restore the keyring), check the pepper keyring
(:func:`qinglong_edge.local.guards.check_keyring`: the
directory and every key file; a wrong mode or owner is exit 73 ``unsafe_pepper``, one
line naming the file, its mode and owner; a missing keyring is 78), refuse to create
an empty database where the keyring proves one existed (exit 73 ``database_missing``),
open the store (migrations run), bind the loopback listener (a port in use is exit
69), start the execution controller when the ``execution`` section is present (see
:func:`start_execution_controller`), serve. The main thread then keeps the storage
caps (:class:`Maintenance`: a pruning pass one second after the start and every 10 s).

While serving, about once a second: a change of the keyring's safety is logged once
(requests fail closed meanwhile, 503 ``authentication_unavailable``); the database
path naming another file, or none (removed or replaced), is logged once and ``serve``
stops: the store is fenced first (nothing more is written), then the drain, and the
exit status is 74 (``database_replaced``), which the systemd unit and procd restart
on; the refusal summaries of requests without a valid credential are written when
their interval ends (:meth:`qinglong_edge.local.api.LocalApi.flush_refusals`).

SIGTERM, SIGINT or SIGHUP starts the drain (local-api.md 2.1): the listener closes, new
requests get 503 ``server_draining``, requests in flight finish within the profile's
drain timeout (edge 5 s, standalone 10 s); meanwhile the controller stops running Runs
(reason ``shutdown``). Then the store
closes. Exit 0 after a clean drain, 75 when requests were still running at the
timeout, 70 if the server's poll thread died, 74 when the database was removed or
replaced while serving. No exit path prints a traceback.

SIGHUP is a drain too, never a death: serve has no live reload (its listener, store and
controller are built from the configuration at start), and SIGHUP's default action would
kill it with requests and Runs in flight. procd sends it for ``procd_send_signal`` /
``ubus call service signal`` without a signal (its default), and a terminal sends it on
hang-up; after the drain procd's respawn starts serve again with the configuration as it
is then. (procd's own reload of a changed configuration is SIGTERM and a start, through
``procd_set_param file``; systemd never sends SIGHUP to this unit: no ``ExecReload``.)

Progress goes to stderr (``qinglong-edge: ...`` lines, never a token or a body); with
``--json`` one summary line is printed on stdout at exit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from qinglong_edge.commands._output import print_json

EX_OK = 0
EX_SOFTWARE = 70
EX_IOERR = 74  # the database was removed or replaced while serving: restart (not in RestartPreventExitStatus)
EX_TEMPFAIL = 75
#: serve's GIL switch interval (CPython's default is 5 ms), seconds.
_SWITCH_INTERVAL_S = 0.001


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "serve",
        parents=[common],
        help="run the Local API (and the execution controller) until SIGTERM",
        description="Serve the QingLong Local /api/v3 run API on the configured loopback listener; "
        "SIGTERM/SIGINT/SIGHUP drain in-flight requests and exit 0 (no live reload).",
    )
    parser.set_defaults(handler=_run)


class IntentRelay:
    """Forwards the API's intent notifications (``(operation_id, run_id)``) to the
    execution controller once one is attached; until then they are dropped (the
    controller also scans the database on its own interval)."""

    def __init__(self) -> None:
        self.target: Callable[[str, str], None] | None = None

    def __call__(self, operation_id: str, run_id: str) -> None:
        target = self.target
        if target is not None:
            target(operation_id, run_id)


def start_execution_controller(config: Any, store: Any, relay: IntentRelay,
                               on_launch: Callable[[], None] | None = None) -> Callable[[], bool] | None:
    """Start the execution controller (``qinglong_edge.execution``) when configured.

    Called once the store is open and before the listener accepts requests, only when
    the configuration has an ``execution`` section (``execution.maxRunPids`` becomes each
    Run's ``pids.max``; 0: none). The controller thread launches
    queued Runs and converges every durable cancel intent and deadline into a verified
    stop; ``relay.target`` is its non-blocking wake-up, so a new cancel intent or a new
    queued Run is acted on at once (it also scans on its own interval).

    Returns:
        The controller's stop callable (True when every running Run was stopped and
        recorded within its timeout), or None when no controller runs.
    """
    if config.execution is None:
        return None
    from qinglong_edge.execution.controller import ExecutionController

    controller = ExecutionController(store, config.execution, pids_max=config.execution.max_run_pids or None)
    controller.on_launch = on_launch
    controller.start()
    relay.target = controller.on_intent
    stop: Callable[[], bool] = controller.stop
    return stop


def _origin(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def observability(config: Any, store: Any, maintenance: Callable[[], Any]) -> tuple[Any, Any]:
    """``(PublicRoutes or None, ApiMetrics or None)`` for ``localApi.console`` and
    ``localApi.metrics`` (issue 26); both off: ``(None, None)``, nothing loaded.

    The gauges of ``/metrics`` read the store (Runs by status, the caps' usage) in one
    store operation and take the log bytes from the pruner's cached scan
    (``maintenance()`` returns the :class:`Maintenance`, or None before it exists).
    """
    local = config.local_api
    if not local.console and not local.metrics:
        return None, None
    from qinglong_edge import __version__
    from qinglong_edge.local.metrics import ApiMetrics, run_counts
    from qinglong_edge.local.public import ConsoleAssets, PublicRoutes
    from qinglong_edge.local.retention import RetentionCaps, measure_store

    metrics = ApiMetrics(__version__) if local.metrics else None
    caps = RetentionCaps.from_config(config)

    def gauges() -> tuple[dict[str, int], dict[str, tuple[int, int | None]]]:
        runs, usage = store.run(lambda c: (run_counts(c), measure_store(c)))
        current = maintenance()
        scan = None if current is None else current.pruner.log_scan()
        stores: dict[str, tuple[int, int | None]] = {
            "audit_rows": (usage.audit_rows, caps.audit_maximum_entries),
            "terminal_runs": (usage.terminal_runs, caps.run_maximum_entries),
            "database_bytes": (usage.used_bytes, caps.database_maximum_bytes),
        }
        if scan is not None:
            stores["log_bytes"] = (scan.total_bytes, caps.max_total_log_bytes)
        return runs, stores

    console = ConsoleAssets() if local.console else None
    return PublicRoutes(console, metrics, gauges), metrics


class Maintenance:
    """The storage caps, kept by ``serve``'s main thread (issue 16).

    :meth:`tick` runs a pruning pass (:class:`qinglong_edge.local.retention.Pruner`:
    bounded steps, each its own store operation, so requests and the controller go in
    between) at the first call and then every ``MAINTENANCE_INTERVAL_S`` seconds. The
    first pass also sweeps log files a crash left without their row, and prunes to a
    cap lowered since the last start. A failed pass (disk full, store busy) is logged
    once per error code and retried at the next interval; it never stops ``serve``.
    """

    def __init__(self, config: Any, store: Any, stop: Any) -> None:
        from qinglong_edge.local.retention import MAINTENANCE_INTERVAL_S, Pruner, PruneReport, RetentionCaps

        self.pruner = Pruner(store, RetentionCaps.from_config(config))
        self.interval_s = MAINTENANCE_INTERVAL_S
        self.report = PruneReport()
        self._stop = stop
        self._due = 0.0
        self._first = True
        self._failed: str | None = None

    def tick(self) -> None:
        import logging
        import time

        from qinglong_edge.errors import EdgeError

        if time.monotonic() < self._due:
            return
        before = self.report.to_json()
        try:
            self.pruner.run(should_stop=self._stop.is_set, report=self.report)
            self._failed = None
        except (EdgeError, OSError) as exc:
            code = getattr(exc, "code", None) or type(exc).__name__
            if code != self._failed:
                _say(f"pruning failed ({code}); retried every {self.interval_s:.0f} s")
            self._failed = code
        after = self.report.to_json()
        if after != before:
            text = _pruned_text(before, after)
            if self._first and text:
                _say(f"pruned to the storage caps: {text}")
            elif text:
                logging.getLogger("qinglong_edge.retention").info("pruned: %s", text)
        self._first = False
        self._due = time.monotonic() + self.interval_s


def _pruned_text(before: dict[str, Any], after: dict[str, Any]) -> str:
    parts = []
    for key, what in (("auditRows", "audit rows"), ("runs", "Runs"), ("logs", "logs"),
                      ("orphanFiles", "orphan log files"), ("vacuumPages", "free pages returned")):
        n = int(after[key]) - int(before[key])
        if n:
            parts.append(f"{n} {what}")
    return ", ".join(parts)


def _say(text: str) -> None:
    sys.stderr.write(f"qinglong-edge: {text}\n")
    sys.stderr.flush()


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from qinglong_edge.config import load_config
    from qinglong_edge.errors import ConfigError, EdgeError
    from qinglong_edge.local.api import LocalApi
    from qinglong_edge.local.budget import RequestBudget
    from qinglong_edge.local.guards import (
        DatabaseWatch,
        KeyringWatch,
        check_database_present,
        check_keyring,
        check_keyring_present,
    )
    from qinglong_edge.local.server import Server, ServerLimits
    from qinglong_edge.local.store import Store
    from qinglong_edge.local.worker_status import worker_status

    config = load_config(args.config)
    local = config.local_api
    if local is None:
        raise ConfigError("the configuration has no localApi section", path="$.localApi")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="qinglong-edge: %(name)s: %(message)s")
    # Before the keyring's own check, whose remedy for a missing one is `admin init`: with
    # a database that names its keys, that would be wrong (keyring_missing says what is).
    check_keyring_present(local.database_file, local.pepper_keyring_directory)
    check_keyring(local.pepper_keyring_directory)
    check_database_present(local.database_file, local.pepper_keyring_directory)
    # The poll thread may be busy answering a flood (429) while a worker and the store
    # thread serve the operator: each of their many GIL hand-offs (one per SQLite call)
    # would wait up to the default 5 ms switch interval behind it.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    store = Store.open(local.database_file, profile=config.profile, busy_timeout_ms=local.busy_timeout_ms)
    database = DatabaseWatch(store.path)
    keyring = KeyringWatch(local.pepper_keyring_directory)
    stop_controller: Callable[[], bool] | None = None
    controller_stopped: list[bool] = []
    server: Server | None = None
    maintenance: Maintenance | None = None
    clean = False
    lost: str | None = None
    api: LocalApi | None = None
    try:
        relay = IntentRelay()
        limits = ServerLimits.for_profile(config.profile)
        budget = RequestBudget.from_limits(limits)
        # A request waits for each of its (at most two) store operations about one busy
        # timeout: the operation's own lock waits are bounded by it (local/store.py).
        public, metrics = observability(config, store, lambda: maintenance)
        worker = config.worker
        api = LocalApi(store, local.pepper_keyring_directory, on_intent=relay,
                       store_timeout_s=local.busy_timeout_ms / 1000 + 0.25, budget=budget, profile=config.profile,
                       log_directory=None if config.execution is None else config.execution.log_directory,
                       worker_status=None if worker is None else (lambda: worker_status(worker)),
                       public=public, metrics=metrics)
        # Bind first: a second `serve` (the port is taken by the running service) must
        # fail here, before its controller's restart recovery adopts the live service's
        # processes and its exit path stops them as a "shutdown".
        try:
            server = Server(api, host=local.listener.host, port=local.listener.port, limits=limits,
                            classify=api.presents_credential, budget=budget,
                            public=None if public is None else public.is_public,
                            observer=None if metrics is None else metrics.observe)
        except OSError as exc:
            raise EdgeError(
                f"cannot listen on {local.listener.host}:{local.listener.port} ({exc.strerror})",
                code="listener_unavailable",
            ) from None
        stop_controller = start_execution_controller(
            config, store, relay, on_launch=None if metrics is None else (lambda: metrics.count("launches")))
        server.start()
        _say(f"serving the Local API on {local.listener.host}:{server.address[1]} (profile {config.profile})")
        origin = _origin(local.listener.host, server.address[1])
        if local.console:
            _say(f"status console on {origin}/ (sign in with a ql3c credential)")
        if local.metrics:
            _say(f"Prometheus metrics on {origin}/metrics")
        maintenance = Maintenance(config, store, stop)
        while not stop.wait(1.0):
            if not server.healthy:
                _say("the server's poll thread stopped; exiting")
                break
            lost = database.check()
            if lost is not None:
                _say(f"database_replaced: the database {store.path} was {lost} while serving; nothing more is "
                     f"written to it; exiting with status {EX_IOERR} so that the service restarts")
                store.close()  # fence first: the drain must not write to a file that is not the database
                break
            problem = keyring.check()
            if problem is not None:
                _say(problem)
            api.flush_refusals()
            maintenance.tick()
        healthy = server.healthy
        if received and received[0] == signal.SIGHUP:
            _say("SIGHUP: draining (serve has no live reload; procd starts it again, with the configuration "
                 "as it is now)")
        else:
            _say("draining")
        # The controller stops its Runs (reason shutdown) while the HTTP drain runs, so
        # the whole stop fits one grace period (procd/systemd stop timeouts are short).
        controller_thread: threading.Thread | None = None
        if stop_controller is not None:
            stopper = stop_controller
            controller_thread = threading.Thread(
                target=lambda: controller_stopped.append(stopper()), name="qinglong-edge-stop-controller"
            )
            controller_thread.start()
            stop_controller = None
        clean = server.shutdown() and healthy
        server = None
        if controller_thread is not None:
            controller_thread.join()
            clean = clean and all(controller_stopped)
    finally:
        if server is not None:
            server.shutdown(timeout=0)
        if stop_controller is not None:
            controller_stopped.append(stop_controller())
        if api is not None and lost is None:
            api.flush_refusals(force=True)
        store.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if lost is not None:
        status = EX_IOERR
    else:
        status = EX_OK if clean else (EX_TEMPFAIL if stop.is_set() else EX_SOFTWARE)
    _say("stopped" if clean and lost is None else "stopped before every request finished" if lost is None
         else f"stopped (database {lost})")
    if args.json:
        summary: dict[str, Any] = {"ok": clean and lost is None, "drained": clean, "exitStatus": status}
        if lost is not None:
            summary["code"] = "database_replaced"
        if maintenance is not None:
            summary["pruned"] = maintenance.report.to_json()
        print_json(summary)
    return status
