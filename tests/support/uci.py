"""A stand-in for OpenWrt's ``uci`` command: ``/etc/config`` file text -> ``uci show``.

The real ``uci`` is C (openwrt/uci): tests/cli/test_config_render_uci_real.py runs it
(built by tests/support/openwrt_tools.py) and checks this fake against it. The fake
covers what our package needs and says so: ``config <type> ['<name>']``, ``option
<name> <value>``, ``list <name> <value>`` and ``#`` comments, with shell-like quoting (UCI's own
tokenizer accepts single/double quotes and backslashes, like ``shlex``). Output is
``uci show`` formatting (openwrt/uci ``cli.c``): unnamed sections as ``@type[n]``,
every value single-quoted with ``'\\''`` escapes, list items space-separated, an
``option`` with an empty value left out (an empty ``list`` item is kept); see
:func:`qinglong_edge.contracts.uci.format_show`, which implements that formatting.

:func:`install_fake_uci` writes an executable ``uci`` that answers
``uci -q show <package>`` from a prepared dump, for code that runs the real command.
:func:`set_uci_options` edits the file text as ``uci set`` would (tests that configure
an installed package).
"""

from __future__ import annotations

import pathlib
import shlex
from collections.abc import Mapping, Sequence

from qinglong_edge.contracts.uci import UciSection, format_show

__all__ = ["install_fake_uci", "set_uci_options", "uci_file_to_show"]


def uci_file_to_show(text: str, package: str) -> str:
    """Convert the text of ``/etc/config/<package>`` to ``uci show <package>`` output."""
    sections: list[tuple[str, str, dict[str, list[str]]]] = []
    counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = shlex.split(line, comments=True, posix=True)
        if not words:
            continue
        keyword = words[0]
        if keyword == "config" and len(words) in (2, 3):
            kind = words[1]
            index = counts.get(kind, 0)
            counts[kind] = index + 1
            name = words[2] if len(words) == 3 else f"@{kind}[{index}]"
            sections.append((name, kind, {}))
        elif keyword in ("option", "list") and len(words) == 3 and sections:
            options = sections[-1][2]
            if keyword == "option" and words[2] == "":
                options.pop(words[1], None)  # uci drops an empty option (a list keeps an empty item)
            elif keyword == "option":
                options[words[1]] = [words[2]]
            else:
                options.setdefault(words[1], []).append(words[2])
        else:
            raise ValueError(f"line {number}: not understood by this fake uci: {line!r}")
    return format_show(package, [UciSection(n, k, {o: tuple(v) for o, v in opts.items()})
                                 for n, k, opts in sections])


def install_fake_uci(bin_dir: pathlib.Path, package: str, dump: pathlib.Path) -> pathlib.Path:
    """Write ``bin_dir/uci``: ``uci -q show <package>`` prints ``dump``; anything else exits 1."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "uci"
    script.write_text(
        "#!/bin/sh\n"
        "# fake uci (tests/support/uci.py): only `uci -q show PACKAGE`\n"
        '[ "$1" = -q ] && shift\n'
        f'if [ "$1" = show ] && [ "$2" = {shlex.quote(package)} ] && [ $# -eq 2 ]; then\n'
        f"    exec cat {shlex.quote(str(dump))}\n"
        "fi\n"
        'echo "uci: Entry not found" >&2\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return script


def set_uci_options(text: str, section: str, options: Mapping[str, str | Sequence[str]]) -> str:
    """Edit ``/etc/config`` text as ``uci set``/``uci add_list`` would: in the named section
    ``section``, every option given is set (a ``str``: ``option NAME 'VALUE'``) or its list
    replaced (a sequence: one ``list NAME 'ITEM'`` line each), where it stood or else at
    the end of the section; everything else is kept as is.

    Raises:
        ValueError: no ``config <type> '<section>'`` line, or a value containing ``'``.
    """

    def words(line: str) -> list[str]:
        return shlex.split(line, comments=True)

    def rendered(name: str) -> list[str]:
        value = options[name]
        values = [value] if isinstance(value, str) else list(value)
        if any("'" in item for item in values):
            raise ValueError(f"{name}: quotes are not supported by this helper")
        keyword = "option" if isinstance(value, str) else "list"
        return [f"\t{keyword} {name} '{item}'" for item in values]

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if words(line)[:1] == ["config"] and words(line)[2:3] == [section]),
                 None)
    if start is None:
        raise ValueError(f"no section {section!r}")
    end = next((i for i in range(start + 1, len(lines)) if words(lines[i])[:1] == ["config"]), len(lines))
    body: list[str] = []
    done: set[str] = set()
    for line in lines[start + 1:end]:
        name = words(line)[1] if len(words(line)) > 1 else ""
        if name not in options:
            body.append(line)
        elif name not in done:
            body += rendered(name)
            done.add(name)
    while body and not body[-1].strip():
        body.pop()
    for name in options:
        if name not in done:
            body += rendered(name)
    return "\n".join([*lines[:start + 1], *body, "", *lines[end:]]).rstrip("\n") + "\n"
