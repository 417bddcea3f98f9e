"""CLI command groups. Each module has ``register(subparsers, common)``.

A module imports only what ``--help`` can afford at top level; the layer a command
needs is imported inside its handler.
"""

from __future__ import annotations
