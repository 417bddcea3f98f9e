"""Remote Worker role (ADR-0110): journal, owner lock, ingress transport, session, pull."""
