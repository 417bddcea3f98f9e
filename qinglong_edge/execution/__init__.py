"""Execution control of the Local profile (ADR-0372 decision 6, local-api.md sections 7-8).

The store-bound half of running a Local Run: ``transitions`` (the control
transactions), ``launcher`` (claim a queued attempt and start it) and ``controller``
(the one control thread). Processes themselves are started and stopped by the
process core, :mod:`qinglong_edge.process`. Importing this package has no side effects.
See docs/execution.md.
"""
