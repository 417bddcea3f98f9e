"""The explicit phases of the execution controller and of each Run it controls.

Each table maps a phase to the phases it may move to; every move is checked against it
(:func:`~qinglong_edge.process.stop.check_transition`, ``ExecutionError`` code
``invalid_phase`` on a move the table does not list: a bug, never a Run's fault).
A stop itself has its own phases (``new -> terminating -> killing -> done``:
:data:`qinglong_edge.process.stop.STOP_TRANSITIONS`).

The controller (:attr:`ExecutionController.phase
<qinglong_edge.execution.controller.ExecutionController.phase>`)::

    new          -> recovering   start(): the thread starts; restart recovery first
    recovering   -> controlling  recovery is complete (each pass retries an incomplete
                                 one first; launches and stops already run meanwhile)
    recovering   -> draining     stop() was called before recovery completed
    controlling  -> draining     stop(): the shutdown drain
    draining     -> closed       the drain is over (or failed); the thread ends
    new          -> closed       stop() on a controller never started

A controlled Run (:attr:`ActiveRun.phase <qinglong_edge.execution.launcher.ActiveRun.phase>`:
launched by us, or adopted after a restart)::

    running      -> stopping     a cancel intent, deadline or shutdown: its stop began
    running      -> completing   our child exited by itself: leftovers are stopped first
    running      -> reconciling  an adopted process is gone: leftovers are stopped first
    stopping     -> finished     the stop was conclusive and the Run is terminal
    stopping     -> completing   nothing was left to signal and our child had exited:
                                 its natural exit wins (local-api.md 7.2 step 6)
    stopping     -> running      the stop was not conclusive (retried after one control
                                 interval), or the terminal write did not apply or failed
    completing   -> finished     the completion is recorded
    completing   -> running      the completion could not be recorded (the next pass
                                 retries it)
    reconciling  -> finished     recorded lost (or already terminal)
    reconciling  -> running      it has an intent: the candidate pass terminalises it;
                                 or the write failed
    finished                     terminal recorded; reaped and forgotten

While a Run is ``stopping``, ``completing`` or ``reconciling`` its stop is under way on
the controller's one thread (one :class:`~qinglong_edge.process.stop.Stopping` per
attempt); the controller does not start a second one for it, and nothing else about it is
decided until that stop is over.
"""

from __future__ import annotations

__all__ = ["CONTROLLER_TRANSITIONS", "RUN_TRANSITIONS"]

#: Controller phase -> the phases it may move to (module docstring).
CONTROLLER_TRANSITIONS: dict[str, frozenset[str]] = {
    "new": frozenset({"recovering", "closed"}),
    "recovering": frozenset({"controlling", "draining"}),
    "controlling": frozenset({"draining"}),
    "draining": frozenset({"closed"}),
    "closed": frozenset(),
}

#: Controlled Run phase -> the phases it may move to (module docstring).
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    "running": frozenset({"stopping", "completing", "reconciling"}),
    "stopping": frozenset({"finished", "completing", "running"}),
    "completing": frozenset({"finished", "running"}),
    "reconciling": frozenset({"finished", "running"}),
    "finished": frozenset(),
}
