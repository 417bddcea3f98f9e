"""The tests wait for conditions, not for time (issue 27 item 6).

A test waits with :func:`tests.support.wait.wait_until` (poll a condition with a deadline)
or for a positive event (an exchange with the cluster double, a log line, a file, a
process state). ``time.sleep`` stays only where time passing *is* the scenario: a job's
pacing, a timer or clock the test must let run, a window a rate is counted over. Each kept
sleep is listed below, by file and count, with its reason; a new one fails here until it is
replaced by a wait or listed with its reason.
"""

from __future__ import annotations

import ast
import functools
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent

#: file (relative to tests/) -> (number of ``time.sleep`` calls, why they stay).
KEPT_SLEEPS: dict[str, tuple[int, str]] = {
    "support/wait.py": (1, "the poll interval of wait_until itself"),
    "support/attack_driver.py": (1, "a cgroup-removal poll in a file that runs alone (python -I), without tests.support"),
    "support/attack_job.py": (1, "a forked child of the hostile job holds its slot"),
    "support/job_agent.py": (1, "the stand-in agent idles until the test kills it"),
    "support/controller_main.py": (1, "the stand-in agent keeps its controller awake until it is killed"),
    "support/envelope_driver.py": (2, "the bomb's cap sampled every 10 ms for 3 s; the readers run a second past it"),
    "support/pull_env.py": (1, "a claim's backoff is on the wall clock the next cycle reads"),
    "support/tls_server.py": (1, "a scripted slow answer (Respond.delay_s)"),
    "cli/test_log_follow.py": (1, "a log that grows while it is followed"),
    "cli/test_pull_cli.py": (2, "the 5 s heartbeat interval passes on the clocks a fresh pull reads"),
    "cli/test_pull_execution.py": (1, "a 9 s window the refused heartbeats are counted over (their rate: no busy loop)"),
    "cli/test_serve_guards.py": (1, "the periodic key check runs at least twice more while the key stays unsafe"),
    "local/test_local_api_transport.py": (1, "the head timeout passes on an idle keep-alive connection"),
    "local/test_server.py": (1, "a slow handler (admission past the request timeout)"),
    "process/test_stop_steps.py": (1, "the walker sleeps what each stop step asks, as the controller's loop does"),
    "process/test_wrapper_lease.py": (1, "the agent's renewals every 100 ms for 2 s, past the 300 ms lease"),
    "worker/ingress/test_transport_http.py": (1, "an idle connection ages past IDLE_REUSE_MAX_S"),
    "worker/journal/test_ownerlock.py": (1, "real time passes past stale while the owner is stopped"),
}


def _sleeps(tree: ast.AST) -> list[int]:
    """Lines of ``time.sleep(...)``, ``asyncio.sleep(...)`` and of a bare ``sleep(...)``
    imported from :mod:`time`."""
    bare = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "time" for alias in node.names if alias.name == "sleep"}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name)
                and func.value.id in ("time", "asyncio")) or (isinstance(func, ast.Name) and func.id in bare):
            lines.append(node.lineno)
    return sorted(lines)


@functools.cache
def _trees(*needles: bytes) -> tuple[tuple[str, ast.Module], ...]:
    """The Python files under tests/ whose text holds one of ``needles``, parsed: (path
    relative to tests/, tree). The text filter only saves parsing the others."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        data = path.read_bytes()
        if any(needle in data for needle in needles):
            found.append((path.relative_to(TESTS).as_posix(), ast.parse(data, filename=str(path))))
    return tuple(found)


def _census() -> dict[str, list[int]]:
    return {name: lines for name, tree in _trees(b"sleep") if (lines := _sleeps(tree))}


def test_no_sleep_outside_the_kept_ones() -> None:
    census = _census()
    unlisted = {name: lines for name, lines in census.items() if len(lines) > KEPT_SLEEPS.get(name, (0, ""))[0]}
    assert not unlisted, (
        f"time.sleep in tests: {unlisted}; wait for a condition with tests.support.wait.wait_until "
        "(or for a positive event), or, if time passing is the scenario, list it in KEPT_SLEEPS with why")


def test_the_kept_list_is_exact() -> None:
    """A sleep replaced by a wait leaves the list too: it never allows more than there is."""
    census = _census()
    stale = {name: (count, len(census.get(name, []))) for name, (count, _) in KEPT_SLEEPS.items()
             if len(census.get(name, [])) != count}
    assert not stale, f"KEPT_SLEEPS (listed, found): {stale}"


#: The generic waits: the one helper, and the methods that wait on a condition variable
#: (woken by the server's own threads, no polling) or over wait_until.
WAITS = [
    ("support/cluster_double.py", "wait_for"),  # ClusterDouble: a Condition over the exchanges
    ("support/envelope_driver.py", "wait_for"),  # Lines: a needle in a child's output, over wait_until
    ("support/tls_server.py", "wait_for"),  # TLSServer: a Condition over what it recorded
    ("support/wait.py", "wait_until"),
]


def test_one_wait_helper() -> None:
    """``wait_until`` is defined once (tests/support/wait.py); no module polls with its own."""
    defined = sorted(
        (name, node.name)
        for name, tree in _trees(b"until", b"wait_for", b"poll")
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.name in ("wait_until", "wait_for", "poll", "until") or node.name.lstrip("_") in ("until", "wait_for"))
    )
    assert defined == WAITS


def test_the_census_sees_every_form() -> None:
    tree = ast.parse("import time\nimport asyncio\nfrom time import sleep as nap\n"
                     "time.sleep(1)\nasyncio.sleep(1)\nnap(1)\nother.sleep(1)\n")
    assert _sleeps(tree) == [4, 5, 6]


def test_wait_until_returns_the_value_or_the_last_falsy_one_or_raises() -> None:
    from tests.support.wait import wait_until

    calls: list[int] = []

    def third() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert wait_until(third, 5, interval=0) == 3
    assert wait_until(list, 0.05) == []  # timed out: the last (falsy) value
    try:
        wait_until(lambda: None, 0.05, what="nothing")
    except AssertionError as exc:
        assert str(exc) == "timed out after 0.05 s waiting for nothing"
    else:
        raise AssertionError("what= did not raise")
