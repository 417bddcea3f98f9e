"""The journal wing: the claim and inbox files' crash safety, the owner lock, the runtime directory.

See docs/worker/journal.md.
"""
