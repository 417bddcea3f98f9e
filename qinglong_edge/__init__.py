"""qinglong-edge: a QingLong 3.0 Remote Worker and Local run API for small devices.

Folders import only what the graph of tests/test_layers.py allows (docs/architecture.md,
"Layers"): ``contracts`` (pure validators) at the bottom, then ``errors``/``config``, the
process core, the worker's wings, ``local``, ``execution``, and ``commands``/``cli`` on top.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
