"""``uci show`` text: a sans-IO parser and its exact inverse.

OpenWrt keeps configuration in UCI files (``/etc/config/<package>``). The stable,
scriptable view of one package is ``uci -q show <package>`` (openwrt/uci ``cli.c``:
``uci_show_package`` / ``uci_show_section`` / ``uci_show_value``), which prints, for
every section in file order::

    <package>.<section>=<type>
    <package>.<section>.<option>='<value>'
    <package>.<section>.<list>='<item>' '<item>' ...

* ``<section>`` is the section's name, or ``@<type>[<n>]`` for an unnamed section (the
  n-th section of that type, counting from 0; ``-X`` prints the internal ``cfgXXXXXX``
  name instead, which is accepted as an ordinary name);
* every value is single-quoted and each ``'`` inside it is written ``'\\''``
  (``uci_print_value``); values may contain spaces and newlines;
* list items are separated by one space (the default ``-d`` delimiter);
* a one-item list prints exactly like an option, so the caller decides per option name
  whether it is a list (:attr:`UciSection.options` always holds a tuple).

This module only parses and formats; mapping UCI options to the agent's JSON
configuration is :mod:`qinglong_edge.commands.config`'s job.

Limits: text <= 256 KiB (:data:`MAX_TEXT_CHARS` characters), <= 64 sections, <= 128
options per section, <= 64 items per option, <= 4096 characters per value; NUL is
rejected anywhere; empty lines are skipped.

Errors: :class:`ContractError` with code ``invalid_uci``; ``path`` is the UCI name of
the offending line (``pkg.section.option``), or ``line N`` when no name was read yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from qinglong_edge.contracts.errors import ContractError

__all__ = [
    "MAX_TEXT_CHARS",
    "UciSection",
    "format_show",
    "parse_show",
    "quote_value",
]

MAX_TEXT_CHARS = 256 * 1024
MAX_SECTIONS = 64
MAX_OPTIONS = 128
MAX_ITEMS = 64
MAX_VALUE_CHARS = 4096

# openwrt/uci: package names may contain '-' (uci_validate_package); section and
# option names only alphanumerics and '_' (uci_validate_name). Types are checked
# leniently ('-' allowed) because callers reject unknown types anyway.
_PACKAGE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_NAME = re.compile(r"[A-Za-z0-9_]+")
_TYPE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_ANONYMOUS = re.compile(r"@([A-Za-z0-9_][A-Za-z0-9_-]*)\[([0-9]{1,4})\]")


@dataclass(frozen=True, slots=True)
class UciSection:
    """One section of a ``uci show`` dump.

    Attributes:
        name: the name as shown: ``main``, or ``@agent[0]`` for an unnamed section.
        type: the section type (``agent``).
        options: option name -> values, in dump order; one value for an option,
            one or more for a list.
    """

    name: str
    type: str
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _fail(path: str, detail: str) -> ContractError:
    return ContractError("invalid_uci", path, detail)


def _line_of(text: str, pos: int) -> str:
    return f"line {text.count(chr(10), 0, pos) + 1}"


def _read_quoted(text: str, pos: int, where: str) -> tuple[str, int]:
    """Read one ``'...'`` value (with ``'\\''`` escapes) starting at ``pos``.

    Returns the value and the index just past its closing quote.
    """
    parts: list[str] = []
    while True:
        # text[pos] is an opening quote here.
        end = text.find("'", pos + 1)
        if end < 0:
            raise _fail(where, "unterminated quoted value")
        parts.append(text[pos + 1 : end])
        pos = end + 1
        if text.startswith("\\''", pos):
            # '\'' = close, escaped quote, reopen.
            parts.append("'")
            pos += 2
            continue
        value = "".join(parts)
        if len(value) > MAX_VALUE_CHARS:
            raise _fail(where, f"value longer than {MAX_VALUE_CHARS} characters")
        return value, pos


def _read_values(text: str, pos: int, where: str) -> tuple[tuple[str, ...], int]:
    """Read ``'a' 'b' ...`` up to the end of the line; return values and next index."""
    values: list[str] = []
    while True:
        if pos >= len(text) or text[pos] != "'":
            raise _fail(where, "every value must be single-quoted, as `uci show` prints it")
        value, pos = _read_quoted(text, pos, where)
        values.append(value)
        if len(values) > MAX_ITEMS:
            raise _fail(where, f"more than {MAX_ITEMS} list items")
        if pos >= len(text):
            return tuple(values), pos
        if text[pos] == "\n":
            return tuple(values), pos + 1
        if text[pos] != " ":
            raise _fail(where, "unexpected character after a quoted value")
        pos += 1


def parse_show(text: str, package: str) -> tuple[UciSection, ...]:
    """Parse the output of ``uci -q show <package>``.

    Args:
        text: the dump, decoded (UTF-8) text. An empty dump has no sections.
        package: the expected package name; a line for any other package is an error.

    Returns:
        The sections in dump order.

    Raises:
        ContractError: ``invalid_uci`` naming the line or UCI name: a line that is not
            ``pkg.section=type`` / ``pkg.section.option=values``, another package, an
            option before its section, a repeated section or option, an unquoted or
            unterminated value, NUL, or a limit exceeded.
    """
    if not _PACKAGE.fullmatch(package):
        raise _fail("$", "invalid package name")
    if len(text) > MAX_TEXT_CHARS:
        raise _fail("$", f"dump longer than {MAX_TEXT_CHARS} characters")
    if "\0" in text:
        raise _fail(_line_of(text, text.index("\0")), "NUL character")
    sections: list[tuple[str, str, dict[str, tuple[str, ...]]]] = []
    by_name: dict[str, dict[str, tuple[str, ...]]] = {}
    pos = 0
    while pos < len(text):
        if text[pos] == "\n":  # uci never prints one; tolerate it (e.g. a trailing echo)
            pos += 1
            continue
        line = _line_of(text, pos)
        eq = text.find("=", pos)
        newline = text.find("\n", pos)
        if eq < 0 or 0 <= newline < eq:
            raise _fail(line, "expected <package>.<section>[.<option>]=<value>")
        parts = text[pos:eq].split(".")
        if parts[0] != package:
            raise _fail(line, f"not a line of package {package!r}")
        if len(parts) == 2:
            section = parts[1]
            end = len(text) if newline < 0 else newline
            kind = text[eq + 1 : end]
            where = f"{package}.{section}"
            if not _TYPE.fullmatch(kind):
                raise _fail(where, "invalid section type")
            anonymous = _ANONYMOUS.fullmatch(section)
            if anonymous is not None:
                if anonymous.group(1) != kind:
                    raise _fail(where, "unnamed section reference does not match its type")
            elif not _NAME.fullmatch(section):
                raise _fail(where, "invalid section name")
            if section in by_name:
                raise _fail(where, "section appears twice")
            if len(sections) >= MAX_SECTIONS:
                raise _fail(where, f"more than {MAX_SECTIONS} sections")
            options: dict[str, tuple[str, ...]] = {}
            sections.append((section, kind, options))
            by_name[section] = options
            pos = end + 1
        elif len(parts) == 3:
            section, option = parts[1], parts[2]
            where = f"{package}.{section}.{option}"
            if section not in by_name:
                raise _fail(where, "option before its section line")
            if not _NAME.fullmatch(option):
                raise _fail(where, "invalid option name")
            options = by_name[section]
            if option in options:
                raise _fail(where, "option appears twice")
            if len(options) >= MAX_OPTIONS:
                raise _fail(where, f"more than {MAX_OPTIONS} options in one section")
            options[option], pos = _read_values(text, eq + 1, where)
        else:
            raise _fail(line, "expected <package>.<section>[.<option>]=<value>")
    return tuple(UciSection(name, kind, options) for name, kind, options in sections)


def quote_value(value: str) -> str:
    """Quote one value exactly like ``uci show`` (``'`` becomes ``'\\''``)."""
    return "'" + value.replace("'", "'\\''") + "'"


def format_show(package: str, sections: Iterable[UciSection]) -> str:
    """Render sections exactly as ``uci show <package>`` prints them.

    The inverse of :func:`parse_show` for every dump it accepts. Option values must be
    non-empty tuples.
    """
    lines: list[str] = []
    for section in sections:
        lines.append(f"{package}.{section.name}={section.type}\n")
        for option, values in section.options.items():
            rendered = " ".join(quote_value(v) for v in values)
            lines.append(f"{package}.{section.name}.{option}={rendered}\n")
    return "".join(lines)
