"""The process core: run one job as a real process and stop it (no SQLite, no HTTP).

Shared by the Local execution controller (:mod:`qinglong_edge.execution`) and the
Remote Worker's runner (:mod:`qinglong_edge.worker`). Importing this package has no
side effects; the modules are imported where needed: ``identity`` (process identity,
the durable ``ql3lp1.`` handle), ``cgroups`` (a cgroup per job), ``jobspec`` (what a job
is), ``spawn`` (start a job under the job wrapper, behind the start barrier),
``wrapper`` (the job wrapper *program*: run, never imported by the agent), ``logs``
(what the wrapper publishes, read back), ``isolation`` (does job isolation work here),
``stop`` (verified stop). See docs/process.md.
"""
