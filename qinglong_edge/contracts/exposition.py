"""The Prometheus text exposition format 0.0.4 (issue 26 item 5), written, never parsed.

Used by ``serve``'s ``GET /metrics`` (:mod:`qinglong_edge.local.metrics`) and by the
node_exporter textfile each cron ``pull`` writes (:mod:`qinglong_edge.worker.delivery.cycle_status`).
Format facts (Prometheus "Exposition formats"): one ``# HELP`` and one ``# TYPE`` line
per family, then its samples ``name{label="value",...} number``; metric and label names
``[a-zA-Z_:][a-zA-Z0-9_:]*`` / ``[a-zA-Z_][a-zA-Z0-9_]*``; label values escape ``\\``,
``"`` and newline; HELP text escapes ``\\`` and newline; a histogram has cumulative
``_bucket{le=..}`` samples ending with ``le="+Inf"``, then ``_sum`` and ``_count``; the
text ends with a newline. ``promtool check metrics`` checks what we write (.ci/run).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["CONTENT_TYPE", "Family", "histogram_family", "render"]

#: ``Content-Type`` of the text format (Prometheus accepts it from any exporter).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_REST = _FIRST | frozenset("0123456789")
_TYPES = ("counter", "gauge", "histogram", "untyped")


def _number(value: float) -> str:
    if isinstance(value, bool):
        raise TypeError("a sample value must be a number")
    if isinstance(value, int):
        return str(value)
    if value != value:  # noqa: PLR0124 - NaN, without importing math on the pull path
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _name_ok(name: str, *, colon: bool) -> bool:
    """``[a-zA-Z_:][a-zA-Z0-9_:]*`` (metric) or ``[a-zA-Z_][a-zA-Z0-9_]*`` (label); no
    regex: this module is on the pull path, where every compile is paid each minute."""
    extra = {":"} if colon else set()
    return bool(name) and (name[0] in _FIRST or name[0] in extra) and all(c in _REST or c in extra for c in name)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Family:
    """One metric family: name, type, help and its samples.

    ``samples``: ``(suffix, labels, value)`` with ``suffix`` ``""`` or ``_bucket`` /
    ``_sum`` / ``_count`` for histograms; ``labels`` in the order to print.
    """

    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        if not _name_ok(name, colon=True) or kind not in _TYPES:
            raise ValueError(f"bad metric family {name!r} / {kind!r}")
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = []

    def add(self, value: float, labels: Sequence[tuple[str, str]] = (), suffix: str = "") -> Family:
        """Append one sample (returns self, to chain)."""
        for key, _ in labels:
            if not _name_ok(key, colon=False) or key.startswith("__"):
                raise ValueError(f"bad label name {key!r}")
        self.samples.append((suffix, tuple(labels), value))
        return self


def histogram_family(name: str, help_text: str, bounds: Sequence[float], counts: Sequence[int], *,
                     total: float, count: int) -> Family:
    """A histogram from per-bucket (not cumulative) ``counts``, one per bound plus the
    ``+Inf`` overflow; ``total`` the sum of the observations, ``count`` their number."""
    if len(counts) != len(bounds) + 1:
        raise ValueError("one count per bound plus +Inf")
    family = Family(name, "histogram", help_text)
    running = 0
    for bound, n in zip(bounds, counts, strict=False):
        running += n
        family.add(running, (("le", _number(float(bound))),), "_bucket")
    running += counts[-1]
    family.add(running, (("le", "+Inf"),), "_bucket")
    family.add(total, (), "_sum")
    family.add(count, (), "_count")
    return family


def render(families: Iterable[Family]) -> bytes:
    """The exposition text of ``families`` (UTF-8, newline-terminated)."""
    lines: list[str] = []
    for family in families:
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {help_text}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for suffix, labels, value in family.samples:
            text = ",".join(f'{key}="{_escape(val)}"' for key, val in labels)
            lines.append(f"{family.name}{suffix}{{{text}}} {_number(value)}" if text
                         else f"{family.name}{suffix} {_number(value)}")
    return ("\n".join(lines) + "\n").encode("utf-8")
