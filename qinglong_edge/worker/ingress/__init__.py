"""The ingress wing: the HTTPS client to the control plane (TLS 1.3 mTLS, HTTP/1.1); docs/worker/ingress.md."""
