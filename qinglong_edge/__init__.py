"""qinglong-edge: a QingLong 3.0 Remote Worker and Local run API for small devices.

Layers (lower never imports upper): ``contracts`` (pure validators) <
``errors``/``config`` < ``worker`` < ``local`` < ``execution`` < ``commands``/``cli``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
