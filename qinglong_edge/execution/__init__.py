"""Execution control of the Local profile (ADR-0372 decision 6, local-api.md sections 7-8).

Importing this package has no side effects; the modules are imported where needed:
``identity`` (process identity, durable handle), ``cgroups`` (a cgroup per Run),
``process`` (verified stop), ``logs`` (bounded Run output), ``launcher`` (claim and
start), ``controller`` (the one control thread).
"""
