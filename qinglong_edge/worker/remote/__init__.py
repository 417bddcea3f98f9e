"""The remote wing: resident remote execution: the runner, the seven calls, the job's files (docs/worker/remote.md)."""
