"""Remote Worker role (ADR-0110): ``cycle`` (one cron cycle, then the resident loop), ``drain`` and
``runtime_files`` on top of four wings: ``journal``, ``ingress``, ``delivery``, ``remote`` (docs/architecture.md
"Layers"; a page per wing in docs/worker/)."""

from __future__ import annotations
