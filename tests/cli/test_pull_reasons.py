"""``pull`` names the transport reason and its remedy (issue 18 item 1): in the human
line, in ``--json`` and for session and offer calls alike. The real CLI in a child
process, against the cluster double and against real faulty servers."""

from __future__ import annotations

import pathlib
import socket

import pytest

from qinglong_edge.errors import transport_remedy
from tests.support.cluster_double import ClusterDouble
from tests.support.pull_env import PullEnv
from tests.support.tls_server import PlainHTTPServer, TLSServer, http_response


@pytest.fixture
def env(tmp_path: pathlib.Path, shared_cluster: ClusterDouble) -> PullEnv:
    shared_cluster.reset(tasks=())
    return PullEnv(tmp_path, shared_cluster)


def test_an_expired_cluster_certificate_is_named_for_the_offer_call(env: PullEnv) -> None:
    """Registered against the cluster, then the cluster presents an expired certificate:
    the heartbeat fails (the stored session stays usable), the offer call fails, and
    both the line and the JSON say certificate_expired with its remedy."""
    assert env.pull("--json").status == 0  # registers
    with TLSServer(identity="server-expired") as expired:
        env.write_config(origin=expired.origin())
        human = env.pull()
        claim = env.claim()
        assert claim is not None  # kept, backing off
        env.wait_until_due(claim)  # else the next cycle is a backoff, with no network I/O
        data = env.pull("--json")
    assert human.status == 75
    line = human.stdout.strip().splitlines()[-1]
    assert line.startswith("pull: unavailable (certificate_expired); claim "), line
    assert line.endswith("-> " + transport_remedy("certificate_expired")), line
    last = data.last()
    assert (last["status"], last["reason"], last["remedy"]) == (
        "unavailable", "certificate_expired", transport_remedy("certificate_expired"))
    assert "clock" in last["remedy"]


def test_a_failed_register_names_the_reason(env: PullEnv) -> None:
    with PlainHTTPServer() as plain:
        env.write_config(origin=plain.origin())
        human = env.pull()
        data = env.pull("--json")
    assert human.status == 75
    assert human.stdout.startswith("pull: session_unavailable (plaintext_peer): register: "), human.stdout
    assert human.stdout.rstrip().endswith("-> " + transport_remedy("plaintext_peer"))
    last = data.last()
    assert (last["status"], last["code"], last["reason"]) == ("failed", "session_unavailable", "plaintext_peer")
    assert last["remedy"] == transport_remedy("plaintext_peer")


def test_a_refused_port_and_an_unresolvable_name(env: PullEnv) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env.write_config(origin=f"https://127.0.0.1:{sock.getsockname()[1]}")
        refused = env.pull("--json").last()
    env.write_config(origin="https://qinglong-edge-test.invalid:7443")
    unresolved = env.pull("--json").last()
    assert (refused["reason"], unresolved["reason"]) == ("connection_refused", "dns_failure")


def test_a_non_200_keeps_its_status_in_the_reason_and_remedy(env: PullEnv) -> None:
    assert env.pull("--json").status == 0
    answer = b'{"code":"admission_capacity_exhausted"}'
    with TLSServer(lambda request: http_response(503, answer)) as busy:
        env.write_config(origin=busy.origin())
        last = env.pull("--json").last()
    assert (last["status"], last["reason"], last["httpStatus"]) == ("unavailable", "unexpected_status", 503)
    assert last["remedy"] == transport_remedy("unexpected_status", 503)


def test_an_idle_cycle_carries_no_remedy(env: PullEnv) -> None:
    last = env.pull("--json").last()
    assert last["status"] == "idle" and "remedy" not in last
