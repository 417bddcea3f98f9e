"""Test-only helpers: servers, PKI, cluster double. Never shipped in a package."""
