"""The process core: run one job as a real process and stop it (no SQLite, no HTTP).

Shared by the Local execution controller (:mod:`qinglong_edge.execution`) and the
Remote Worker's runner (:mod:`qinglong_edge.worker`). Importing this package has no
side effects; the modules are imported where needed: ``identity`` (process identity,
the durable ``ql3lp1.`` handle), ``cgroups`` (a cgroup per job), ``spawn`` (start behind
the start barrier), ``logs`` (bounded job output), ``stop`` (verified stop).
"""
