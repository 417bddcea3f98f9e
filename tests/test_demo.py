"""``make demo`` keeps working: demo/run_demo.py end to end, as a person runs it.

The demo is run as a child process (the real cluster double process, the real CLI,
``serve``, curl or its stand-in); the tests read what it printed and what it left, and
check that no process it started outlives it, also when it is interrupted.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.support.wait import wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "demo" / "run_demo.py"

#: Lines the demo must print when every step went right, in this order.
KEY_LINES = [
    "$ python3 -m qinglong_edge doctor",
    "doctor: all required checks passed",
    "(new_claim)",
    "completion acknowledged",
    "hello from qinglong-edge",  # the shell task's output, as the cluster stored it
    "succeeded, exit code 0",
    "the shell task ran on the device once",
    "$ kill -USR1 ",
    "(exit status 75)",
    "the claim is kept, nothing is lost",
    "a byte-identical request body",
    "cluster_admin --state-dir",
    "stop requested (reason user)",
    "exitCode 143",
    "the cluster's cancel stopped the job on the device",
    "idle (no_candidates)",
    "2 leases on the cluster, 2 offers in the inbox (each run once: one succeeded, one cancelled), and the idle "
    "cycle's claim kept for the next cycle",
    "nothing lost, nothing duplicated",
    "$ python3 -m qinglong_edge admin init",
    "OPERATOR_TOKEN=$(python3 -m qinglong_edge admin credential issue",
    "serving the Local API on 127.0.0.1:",
    "status console on http://127.0.0.1:",  # serve's own line (issue 26)
    "status console: http://127.0.0.1:",
    "HTTP/1.1 202 Accepted",  # task.start
    "run.status running",
    "HTTP/1.1 403 Forbidden",  # the viewer
    "connection: close",
    "is still running",
    "HTTP/1.1 202 Accepted",  # the operator's cancellation
    '"status":"accepted"',
    "HTTP/1.1 200 OK",  # the replay
    "got SIGTERM at step",
    "run.status cancelled",
    "run.cancel_requested, attempt.cancelled, run.cancelled",
    "is gone and the Run is cancelled",
    "exited with status 0",
    "still cancelled after the restart",
    "no process left",
    "demo finished: every step gave what it should (exit 0)",
]
SECRET = re.compile(r"ql3[cw]_[A-Za-z0-9._:-]+_[A-Za-z0-9_-]{43}")


def _processes_mentioning(text: str) -> list[str]:
    """``pid: cmdline`` of every live process whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry}: {cmdline}")
    return found


def _path_without_curl(tmp_path: pathlib.Path) -> str:
    """A PATH with every tool the demo uses except curl."""
    bindir = tmp_path / "bin-no-curl"
    bindir.mkdir()
    for tool in ("openssl", "install", "mkdir", "tail", "head", "python3"):
        found = sys.executable if tool == "python3" else shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    return str(bindir)


def _env(path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_EDGE_")}
    env.pop("PYTHONPATH", None)  # the demo sets its own: the source tree, nothing installed
    env["NO_COLOR"] = "1"
    if path is not None:
        env["PATH"] = path
    return env


@pytest.mark.slow
@pytest.mark.parametrize("http_client", ["curl", "minicurl"])
def test_demo_runs_end_to_end(tmp_path: pathlib.Path, http_client: str) -> None:
    if http_client == "curl" and shutil.which("curl") is None:
        pytest.skip("curl is not installed (the minicurl case covers this machine)")
    root = tmp_path / "demo"
    path = _path_without_curl(tmp_path) if http_client == "minicurl" else None
    proc = subprocess.run([sys.executable, str(DEMO), "--root", str(root)], cwd=REPO, env=_env(path),
                          capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    position = 0
    for line in KEY_LINES:
        found = out.find(line, position)
        assert found >= 0, f"missing (in order) {line!r}:\n{out[position:position + 2000]}"
        position = found + len(line)
    if http_client == "minicurl":
        assert "curl is not installed" in out
        assert "$ python3 demo/minicurl.py -sS -i -X POST" in out
    else:
        assert "$ curl -sS -i -X POST" in out
    assert "Traceback" not in out + proc.stderr
    # No secret on the screen: credential tokens, nor the lease tokens the journal holds.
    assert SECRET.search(out) is None
    for record in (root / "agent" / "state" / "worker" / "offers").glob("*.json"):
        lease_token = json.loads(record.read_text())["offer"]["leaseToken"]
        assert lease_token not in out
    # Its state is kept for the user, private where it must be.
    assert (root / ".qinglong-edge-demo").is_file()
    assert (root / "agent" / "config.json").stat().st_mode & 0o777 == 0o600
    assert (root / "agent" / "private").stat().st_mode & 0o777 == 0o700
    assert not _processes_mentioning(str(root))


@pytest.mark.slow
def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "demo"
    # Its own process group, signalled as a whole: what a terminal's Ctrl-C does (the
    # demo and any command it is running in the foreground get SIGINT).
    proc = subprocess.Popen([sys.executable, str(DEMO), "--root", str(root)], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "-> serve: pid" in line:
                break
        else:
            pytest.fail("the demo ended before serve started:\n" + "".join(seen))
        assert _processes_mentioning(str(root)), "nothing running to stop"
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(seen) + rest
    assert proc.returncode == 128 + signal.SIGINT, out[-2000:]
    assert "interrupted by SIGINT" in out
    assert re.search(r"stopped: serve \(pid \d+\), cluster \(pid \d+\)", out), out[-2000:]
    assert wait_until(lambda: not _processes_mentioning(str(root)), 5, interval=0.05), _processes_mentioning(str(root))


def test_refuses_to_replace_a_directory_it_did_not_make(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "mine"
    root.mkdir()
    (root / "precious.txt").write_text("keep me\n")
    proc = subprocess.run([sys.executable, str(DEMO), "--root", str(root)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "was not made by the demo" in proc.stdout
    assert (root / "precious.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in root.iterdir()) == ["precious.txt"]


def test_replaces_the_directory_of_its_previous_run(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "demo"
    root.mkdir()
    (root / ".qinglong-edge-demo").write_text("made by demo/run_demo.py\n")
    (root / "stale.txt").write_text("from the last run\n")
    # A PATH without openssl makes the demo stop right after preparing the directory.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    proc = subprocess.run([sys.executable, str(DEMO), "--root", str(root)], cwd=REPO, env=_env(str(bindir)),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "the openssl command is needed" in proc.stdout
    assert "rm -rf" in proc.stdout
    assert not (root / "stale.txt").exists()
    assert (root / ".qinglong-edge-demo").is_file()
