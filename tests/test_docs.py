"""README.md and the pages of docs/ say what the code does.

Each test reads a part of the docs and checks it against the real thing: the config
table against the config parser (every key, bound and default), the command table
against the argument parser, the troubleshooting table against the checks ``doctor``
really runs, the curl examples against the Local API router, the module maps against the
package tree, the folder table against the import graph of ``tests/test_layers.py``, every
link, path and named section against what exists, the README's "Layout" against the
folders, and the README's Local API walkthrough is run as a shell script.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from typing import Any

import pytest

from qinglong_edge.cli import build_parser
from qinglong_edge.config import EdgeConfig, parse_config
from qinglong_edge.doctor import run_checks
from qinglong_edge.errors import ApiError, ConfigError
from qinglong_edge.local import routes

REPO = pathlib.Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
#: Every page of docs/ (docs/architecture.md is the overview; one page per folder).
PAGES = {path: path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").rglob("*.md"))}
PACKAGE = REPO / "qinglong_edge"


def _section(title: str) -> str:
    """The README text from the ``## title`` heading to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _rows(text: str) -> list[list[str]]:
    """Table rows (header and rule excluded) as lists of cell texts."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| ---"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows[1:] if rows and rows[0][0] in ("key", "command", "check", "you see", "guarantee") else rows


# -- configuration --------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "schema": "qinglong/edge-agent@v1",
    "stateDirectory": "/var/lib/qle",
    "worker": {
        "origin": "https://cluster.example:7443",
        "workerId": "edge-1",
        "credentialFile": "/etc/qle/credential",
        "certificateFile": "/etc/qle/client.pem",
        "privateKeyFile": "/etc/qle/client.key",
        "trustAnchorFiles": ["/etc/qle/ca.pem"],
    },
    "localApi": {"listener": {"host": "127.0.0.1", "port": 5700}},
    "execution": {},
}
#: Keys whose range is also bounded by another key: what that key is set to while
#: the bounds are probed (heartbeat x 2 <= session lease, offer-delivery.md 5.1).
COMPANIONS = {
    "worker.heartbeatIntervalMs": {"worker.sessionLeaseDurationMs": 600_000},
    "worker.sessionLeaseDurationMs": {"worker.heartbeatIntervalMs": 5000},
    # maxTotalLogBytes >= maxLogBytes x maxConcurrentRuns (the logs of Runs in flight).
    "execution.maxTotalLogBytes": {"execution.maxLogBytes": 1024},
    "execution.maxLogBytes": {"execution.maxTotalLogBytes": 1_099_511_627_776},
    "execution.maxConcurrentRuns": {"execution.maxTotalLogBytes": 1_099_511_627_776},
}


def _config_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for cells in _rows(_section("Configuration")):
        key = cells[0].strip("`")
        rows[key] = (cells[1], cells[2])
    return rows


def _with(document: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``document`` with dotted ``key`` set (``...`` value: removed)."""
    out = copy.deepcopy(document)
    *parents, last = key.split(".")
    node = out
    for part in parents:
        node = node[part]
    if value is ...:
        node.pop(last, None)
    else:
        node[last] = value
    return out


def _attribute(config: EdgeConfig, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, re.sub(r"([A-Z])", r"_\1", part).lower())
    return node


def _camel_keys(value: Any, prefix: str) -> set[str]:
    """Every config key the parsed config classes hold, as dotted camelCase paths (their
    fields are their ``__slots__``: plain classes since the pull path dropped dataclasses)."""
    keys = set()
    for name in value.__slots__:
        if name == "source":
            continue
        camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
        path = f"{prefix}{camel}"
        keys.add(path)
        child = getattr(value, name)
        if hasattr(child, "__slots__") and type(child).__name__.endswith("Config"):
            keys |= _camel_keys(child, path + ".")
    return keys


def test_every_config_key_is_in_the_readme_table() -> None:
    parsed = parse_config(BASE)
    documented = set(_config_rows())
    keys = _camel_keys(parsed, "") | {"schema"}
    assert keys - documented == set(), "keys missing from the README table"
    assert documented - keys == set(), "README documents keys the parser does not have"


@pytest.mark.parametrize("key", sorted(_config_rows()))
def test_documented_range_and_default_match_the_parser(key: str) -> None:
    allowed, default = _config_rows()[key]
    base = BASE
    for other, value in COMPANIONS.get(key, {}).items():
        base = _with(base, other, value)
    bounds = re.fullmatch(r"(\d+)-(\d+)(?:,.*)?", allowed)
    if bounds:
        low, high = int(bounds.group(1)), int(bounds.group(2))
        assert _attribute(parse_config(_with(base, key, low)), key) == low
        assert _attribute(parse_config(_with(base, key, high)), key) == high
        for wrong in (low - 1, high + 1, str(low), float(low) + 0.5, True):
            with pytest.raises(ConfigError):
                parse_config(_with(base, key, wrong))
    elif allowed.startswith("absolute path"):
        with pytest.raises(ConfigError):
            parse_config(_with(base, key, "relative/path" if "1-8" not in allowed else ["relative"]))
    if allowed == "`true` or `false`":
        for flag in (True, False):
            assert _attribute(parse_config(_with(base, key, flag)), key) is flag
        for wrong in (1, "true", None):
            with pytest.raises(ConfigError):
                parse_config(_with(base, key, wrong))
    if allowed == "absolute path or `null`":
        assert _attribute(parse_config(_with(base, key, None)), key) is None
    choices = re.findall(r'`"([^"]+)"`', allowed)
    if choices and key != "schema":
        for choice in choices:
            assert _attribute(parse_config(_with(base, key, choice)), key) == choice
        with pytest.raises(ConfigError):
            parse_config(_with(base, key, "no-such-choice"))
    # The default.
    if default == "required":
        with pytest.raises(ConfigError):
            parse_config(_with(base, key, ...))
    elif default.startswith("absent"):
        without = _with(base, key, ...)
        if key == "localApi":  # execution needs it
            without = _with(without, "execution", ...)
        assert _attribute(parse_config(without), key) is None
    elif default.startswith("`<stateDirectory>"):
        expected = default.strip("`").replace("<stateDirectory>", BASE["stateDirectory"])
        assert _attribute(parse_config(_with(base, key, ...)), key) == expected
    elif re.match(r"\d", default):
        numbers = [int(n) for n in re.findall(r"\d+", default.split("(")[0])]
        edge = parse_config(_with(base, key, ...))
        assert _attribute(edge, key) == numbers[0]
        standalone = parse_config(_with(_with(base, key, ...), "profile", "standalone"))
        assert _attribute(standalone, key) == numbers[-1]
    elif default in ("`false`", "`true`"):
        assert _attribute(parse_config(_with(base, key, ...)), key) is (default == "`true`")
    elif default.startswith("`null`"):
        assert _attribute(parse_config(_with(base, key, ...)), key) is None
    elif default.startswith('`"'):
        assert _attribute(parse_config(_with(base, key, ...)), key) == default.strip('`"')
    elif default == "none":  # an optional key whose absence is nothing (None, no labels)
        assert not _attribute(parse_config(_with(base, key, ...)), key)
    else:
        pytest.fail(f"{key}: default {default!r} is not a form this test reads")


# -- commands ---------------------------------------------------------------------------------

def _leaf_commands() -> list[tuple[tuple[str, ...], list[str]]]:
    """(command path, its own option flags) for every runnable command."""
    import argparse

    leaves: list[tuple[tuple[str, ...], list[str]]] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            flags = [s for a in parser._actions for s in a.option_strings
                     if s.startswith("--") and s not in ("--help", "--config", "--json")]
            leaves.append((path, flags))
            return
        for name, child in subs[0].choices.items():
            walk(child, (*path, name))

    walk(build_parser(), ())
    return leaves


@pytest.mark.parametrize(("path", "flags"), _leaf_commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_command_and_option_is_in_the_readme(path: tuple[str, ...], flags: list[str]) -> None:
    prefix, last = " ".join(path[:-1]), path[-1]
    rows = [" | ".join(cells) for cells in _rows(_section("Commands"))]
    matching = [row for row in rows if f"`{prefix}" in row and re.search(rf"(?<![\w-]){re.escape(last)}(?![\w-])", row)]
    assert matching, f"no README command row for {' '.join(path)}"
    for flag in flags:
        assert any(flag in row for row in matching), f"{' '.join(path)} {flag} is not documented"


# -- doctor -----------------------------------------------------------------------------------

def test_every_doctor_check_is_in_troubleshooting(tmp_path: pathlib.Path) -> None:
    state = tmp_path / "state"
    journal = tmp_path / "journal"
    for directory in (state, journal):
        directory.mkdir(mode=0o700)
    document = _with(_with(BASE, "stateDirectory", str(state)), "worker.journalDirectory", str(journal))
    checks = run_checks(parse_config(document))
    table = _section("Troubleshooting")
    names = {re.sub(r"_\d+$", "_N", check.name) for check in checks}
    names |= {"sqlite_wal", "sqlite_write", "python", "tls13", "sqlite"}
    for name in sorted(names):
        assert f"`{name}`" in table, f"doctor check {name} is not in the troubleshooting table"


def test_every_transport_reason_is_in_troubleshooting_with_its_remedy() -> None:
    """A row per typed transport reason (issue 18): its remedy, word for word, and
    whether it counts toward the attempt budget (``reached_cluster``)."""
    from qinglong_edge.errors import TRANSPORT_REASONS

    rows = {cells[0]: cells for cells in _rows(_section("Troubleshooting")) if len(cells) == 4}
    for reason, (remedy, reached) in TRANSPORT_REASONS.items():
        row = rows.get(f"`{reason}`")
        assert row is not None, f"transport reason {reason} has no Troubleshooting row"
        assert row[3] == remedy, f"{reason}: the README's remedy differs from errors.TRANSPORT_REASONS"
        assert row[2] == ("yes" if reached else "no"), reason


# -- Local API --------------------------------------------------------------------------------

def test_every_route_has_a_curl_example() -> None:
    text = _section("Local API")
    resolved = set()
    for line in text.splitlines():
        if not line.startswith("curl "):
            continue
        method = "POST" if "-X POST" in line else "GET"
        url = next(token.strip('"') for token in line.split() if token.strip('"').startswith("$API"))
        target = url.replace("$API", "/api/v3/projects/demo").replace("$RUN", "run-1").replace("$ATTEMPT", "a-1")
        try:
            route = routes.resolve(method, target)
        except ApiError as exc:  # a documented example must reach its route
            pytest.fail(f"{method} {target}: {exc.code}")
        resolved.add(route.operation_id)
        assert f"**{route.operation_id}**" in text
    assert resolved == set(routes.PERMISSIONS)


def test_documented_bodies_are_the_contract_bodies() -> None:
    from qinglong_edge.contracts.cancellation import (
        decode_local_api_body,
        parse_run_cancellation_request,
        parse_task_start_request,
    )

    text = _section("Local API") + _section("The Local run API by hand (five minutes)")
    cancels = set(re.findall(r"'(\{\"schema\":\"qinglong/run-cancellation@v1\"[^']*\})'", text))
    starts = set(re.findall(r"'(\{\"schema\":\"qinglong/task-start@v1\"[^']*\})'", text))
    assert cancels and starts
    for body in cancels:
        parse_run_cancellation_request(decode_local_api_body(body.encode()))
    for template in starts:
        # The walkthrough's printf template: a UUID, then a digest.
        body = template.replace('"%s"', '"4f0c5b0e-6a51-4c2e-9d6b-0c1f3b8a7e21"', 1).replace('"%s"', '"' + "a" * 64 + '"')
        parse_task_start_request(decode_local_api_body(body.encode()))


# -- architecture ---------------------------------------------------------------------------

#: A module map line: two spaces, a path under qinglong_edge/, white space, what it is.
_MAP_LINE = re.compile(r"^  ([a-z0-9_/]+\.py)\s", re.M)


def test_module_maps_name_every_module_once() -> None:
    """Each module has exactly one line in the module maps (the overview's or its folder's page)."""
    named: list[str] = []
    for text in PAGES.values():
        for block in re.findall(r"^```\nqinglong_edge/\n(.*?)^```", text, re.S | re.M):
            named += _MAP_LINE.findall(block)
    modules = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert sorted(set(named)) == sorted(named), "a module map names a module twice"
    assert sorted(named) == modules, (f"missing from the module maps: {sorted(set(modules) - set(named))}; "
                                      f"named but absent: {sorted(set(named) - set(modules))}")


def _folder_table() -> dict[str, set[str]]:
    """docs/architecture.md "Layers": folder -> the folders its "may import" cell names."""
    section = ARCHITECTURE.split("## Layers\n", 1)[1].split("\n## ", 1)[0]
    graph = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        folder = re.match(r"`([^`]+)`", cells[0])
        assert folder, line
        graph[folder.group(1).removesuffix("/").removesuffix(".py")] = {
            name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cells[3])}
    return graph


def test_the_folder_table_is_the_import_graph() -> None:
    from tests.test_layers import ALLOWED

    assert _folder_table() == ALLOWED


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in found:
            n += 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


DOCUMENTS = {REPO / "README.md": README, **PAGES}


@pytest.mark.parametrize("page", sorted(DOCUMENTS), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_reach_a_file_and_its_heading(page: pathlib.Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", DOCUMENTS[page]):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link {target} names no file"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved.read_text(encoding="utf-8")), f"{page.name}: link {target}: no such heading"


def _repo_file(name: str) -> bool:
    """A path a page names in backquotes: under the repository, else under qinglong_edge/; a
    bare file name: some file of that name in the repository (tests, packaging...)."""
    if "/" not in name:
        return any(REPO.glob(f"**/{name}"))
    return (REPO / name).exists() or (PACKAGE / name).exists()


@pytest.mark.parametrize("page", sorted(DOCUMENTS), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_python_path_named_exists(page: pathlib.Path) -> None:
    """Every ``path.py`` a page names in backquotes (``qinglong_edge/...``, ``tests/...``,
    ``benchmarks/...``, or relative to the package: ``worker/journal/files.py``) exists."""
    for name in set(re.findall(r"`([\w./-]+\.py)`", DOCUMENTS[page])):
        assert _repo_file(name), f"{page.relative_to(REPO)} names {name}, which does not exist"


def _referring_files() -> list[pathlib.Path]:
    return sorted([REPO / "README.md", *PAGES, *PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py")])


def test_named_sections_exist() -> None:
    """A reference of the form ``docs/<page>.md "Section"`` (in the package, the tests, the
    README or a page) names text that is on that page."""
    pattern = re.compile(r"docs/([\w/.-]+\.md)\)?[,:]?\s*\(?\"([^\"]+)\"")
    for path in _referring_files():
        for page, section in pattern.findall(path.read_text(encoding="utf-8")):
            target = REPO / "docs" / page
            assert target.is_file(), f"{path.relative_to(REPO)} names docs/{page}, which does not exist"
            words = " ".join(section.split()).lower()
            assert words in " ".join(target.read_text(encoding="utf-8").split()).lower(), (
                f'{path.relative_to(REPO)}: docs/{page} has no "{section}"')


def test_readme_layout_names_every_folder_and_page() -> None:
    block = _section("Layout").split("```")[1]
    for folder in sorted(p.parent for p in PACKAGE.rglob("__init__.py")):
        if folder != PACKAGE:
            assert f"{folder.name}/" in block, f"README Layout misses qinglong_edge/{folder.relative_to(PACKAGE)}/"
    for module in sorted(PACKAGE.glob("*.py")):
        if module.name != "__init__.py":
            assert module.name in block, f"README Layout misses qinglong_edge/{module.name}"
    for page in (REPO / "docs").rglob("*"):
        if page.is_file() and page.suffix in (".md", ".json"):
            assert page.relative_to(REPO / "docs").as_posix() in block, f"README Layout misses docs/{page.name}"
    for name in re.findall(r"\b([a-z_]+\.py)\b", block):
        assert any(PACKAGE.rglob(name)) or any(REPO.glob(f"*/{name}")), f"README Layout names {name}, which is gone"


# -- the walkthrough, run ---------------------------------------------------------------------

def _walkthrough() -> str:
    match = re.search(r"<!-- readme-test: local-walkthrough begin -->(.*?)<!-- readme-test: local-walkthrough end -->",
                      README, re.S)
    assert match
    blocks = re.findall(r"```sh\n(.*?)```", match.group(1), re.S)
    assert len(blocks) >= 3
    return "\n".join(blocks)


@pytest.mark.slow
def test_readme_walkthrough_runs(tmp_path: pathlib.Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = _walkthrough().replace("5700", str(port))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "qinglong-edge"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec python3 -m qinglong_edge "$@"\n')
    shim.chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)  # the walkthrough's python3 one-liners
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_EDGE_")}
    env.update(HOME=str(home), PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "doctor: all required checks passed" in out
    assert '"status":"accepted","projectId":"demo","taskId":"counter"' in out
    assert "HTTP/1.1 202 Accepted" in out
    assert "HTTP/1.1 200 OK" in out and '"status":"already_terminal"' in out  # the replay
    gets = re.findall(r'^\{"run":.*$', out, re.M)
    assert json.loads(gets[0])["run"]["status"] == "running"
    final = json.loads(gets[-1])["run"]
    assert final["status"] == "cancelled" and final["latestAttempt"]["status"] == "cancelled"
    assert "qinglong-edge: stopped" in proc.stderr
    logs = list((home / "qinglong-local" / "state" / "logs").glob("*_*.log"))
    assert logs and "step 1" in logs[0].read_text()
    assert re.search(r"^step 1$", out, re.M)  # admin runs log $RUN printed it
