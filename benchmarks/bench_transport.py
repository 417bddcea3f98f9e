"""Benchmark: the worker transport's reuse and streaming (issues 15 and 18).

    python benchmarks/bench_transport.py [--requests N] [--repetitions R] [--upload-mib M]

A TLS 1.3 mTLS server (``tests.support.tls_server.TLSServer``, the committed test
certificates) runs in its own process, so only the client is measured. Three parts:

* ``handshake``: a raw ``ssl`` client (no code of ours) doing N full handshakes and N
  resumed ones (``wrap_socket(session=...)``) against the server: client CPU per
  handshake (``time.process_time``), the floor the transport can reach.
* ``renewal``: N ``IngressTransport.post_json`` calls against a server that closes the
  connection after every answer (a lease renewal every ~10 s meets a cluster whose idle
  connections close after 5 s: every call needs a new handshake): client CPU per call
  with session resumption (ours) and with resumption switched off (the baseline: what
  the transport did before). Also the per-request material re-read (credential, chain,
  key, anchor: ``load_material``) on its own.
* ``upload``: a fresh child process uploads an M MiB file with ``post_stream``; peak RSS
  growth = ``VmHWM`` after the upload - ``VmRSS`` before it (the peak is reset with
  ``/proc/self/clear_refs`` after a warm-up upload). Baseline: the same child with
  ``http.client`` and the file read whole (``body=prefix + data``), which is what
  "hold the log in memory" costs. Target (issue 15): growth <= 1 MiB for 4 MiB.

Medians over R repetitions. Prints one JSON object. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

UPLOAD_TARGET_MIB = 1.0
MIB = 1024 * 1024
SESSION_ID = "01890a5d-ac96-774b-bcce-b302099a8057"
OFFER_PATH = f"/api/v3/worker-ingress/workers/edge-1/sessions/{SESSION_ID}/offers"
ARTIFACT_PATH = OFFER_PATH.replace("/offers", "/artifacts")

SERVER = r'''
import sys
sys.path.insert(0, sys.argv[1])
from tests.support.tls_server import Respond, TLSServer, http_response
mode = sys.argv[2]
if mode == "close":
    answer = Respond(http_response(headers=(("Connection", "close"),)), close=True)
else:
    answer = http_response(200, b'{"status":"stored"}')
with TLSServer(lambda request: answer) as server:
    print(server.port, flush=True)
    sys.stdin.read()
'''

HANDSHAKE = r'''
import json, socket, ssl, sys, time
port, count, certs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_3
context.load_verify_locations(certs + "/root-ca.pem")
context.load_cert_chain(certs + "/client.pem", certs + "/client.key")
request = b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}"

def once(session):
    raw = socket.create_connection(("127.0.0.1", port))
    tls = context.wrap_socket(raw, server_hostname="localhost", session=session)
    tls.sendall(request)
    while tls.recv(65536):
        pass
    reused, session = tls.session_reused, tls.session
    tls.close()
    return reused, session

_, session = once(None)
results = {}
for mode in ("full", "resumed"):
    started = time.process_time()
    for _ in range(count):
        reused, new = once(session if mode == "resumed" else None)
        assert reused == (mode == "resumed"), mode
        if mode == "resumed":
            session = new
    results[mode] = (time.process_time() - started) * 1000 / count
print(json.dumps(results))
'''

RENEWAL = r'''
import json, pathlib, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from tests.support.transport_env import WorkerFiles
from qinglong_edge.worker.ingress.material import load_material
port, count, path, body = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5].encode()
files = WorkerFiles(pathlib.Path(tempfile.mkdtemp()))
results = {}
for mode in ("full", "resumed"):
    transport = files.transport(f"https://localhost:{port}", timeout_ms=10_000)
    if mode == "full":
        transport._keep_session = lambda tls: None  # the transport before resumption
    transport.post_json(path, body, max_response_bytes=4096)  # context built, modules warm
    started = time.process_time()
    for _ in range(count):
        transport.post_json(path, body, max_response_bytes=4096)
    results[mode] = (time.process_time() - started) * 1000 / count
    results[mode + "_stats"] = dict(transport.stats)
    transport.close()
args = (str(files.credential), str(files.certificate), str(files.key), files.anchor_paths)
started = time.process_time()
for _ in range(count * 20):
    load_material(*args)
results["material_us"] = (time.process_time() - started) * 1e6 / (count * 20)
print(json.dumps(results))
'''

UPLOAD = r'''
import json, pathlib, sys, tempfile
sys.path.insert(0, sys.argv[1])
port, size, mode, path, source = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
prefix = b"\x00\x00\x00\x02{}"

def status(key):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise SystemExit(key)

if mode == "ours":
    from tests.support.transport_env import WorkerFiles
    files = WorkerFiles(pathlib.Path(tempfile.mkdtemp()))
    transport = files.transport(f"https://localhost:{port}", timeout_ms=30_000)
    def upload(length):
        with open(source, "rb") as handle:
            transport.post_stream(path, prefix, handle, length, max_response_bytes=4096)
else:
    import http.client, ssl
    certs = sys.argv[1] + "/tests/support/certs/"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(certs + "root-ca.pem")
    context.load_cert_chain(certs + "client.pem", certs + "client.key")
    connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=30)
    def upload(length):
        with open(source, "rb") as handle:
            data = handle.read(length)
        connection.request("POST", path, body=prefix + data,
                           headers={"content-type": "application/vnd.qinglong.worker-artifact"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200

upload(4096)  # warm: modules, context, connection
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # reset VmHWM to the current RSS
before = status("VmRSS")
upload(size)
print(json.dumps({"before_kib": before, "peak_kib": status("VmHWM")}))
'''


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("QINGLONG_EDGE_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)
    return env


class _Server:
    def __init__(self, mode: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", SERVER, str(REPO), mode], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=_env())
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def _child(script: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=_env(),
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(float(s[key]) for s in samples), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="handshakes / calls per mode and repetition")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--upload-mib", type=int, default=4)
    args = parser.parse_args()
    body = '{"workerGeneration":1,"offerId":"o-1","leaseToken":"' + "A" * 43 + '"}'
    handshakes, renewals, ours, naive = [], [], [], []
    size = args.upload_mib * MIB
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "attempt.log"
        source.write_bytes(os.urandom(size))
        with _Server("close") as server:
            for _ in range(args.repetitions):
                handshakes.append(_child(HANDSHAKE, str(server.port), str(args.requests),
                                         str(REPO / "tests" / "support" / "certs")))
                renewals.append(_child(RENEWAL, str(REPO), str(server.port), str(args.requests), OFFER_PATH, body))
        with _Server("stored") as server:
            for _ in range(args.repetitions):
                for mode, samples in (("ours", ours), ("naive", naive)):
                    samples.append(_child(UPLOAD, str(REPO), str(server.port), str(size), mode, ARTIFACT_PATH,
                                          str(source)))
    for sample in ours + naive:
        sample["growth_kib"] = sample["peak_kib"] - sample["before_kib"]
    growth_mib = _median(ours, "growth_kib") / 1024
    result = {
        "requests": args.requests,
        "repetitions": args.repetitions,
        "handshake_raw_ssl_cpu_ms": {"full": _median(handshakes, "full"), "resumed": _median(handshakes, "resumed")},
        "renewal_cpu_ms_per_call": {"resumed": _median(renewals, "resumed"), "full": _median(renewals, "full")},
        "renewal_stats": {"resumed": renewals[-1]["resumed_stats"], "full": renewals[-1]["full_stats"]},
        "material_reread_us_per_request": _median(renewals, "material_us"),
        "upload_mib": args.upload_mib,
        "upload_rss_growth_mib": {"ours": round(growth_mib, 3),
                                  "naive_read_whole": round(_median(naive, "growth_kib") / 1024, 3)},
        "targets": {"upload_rss_growth_mib_max": UPLOAD_TARGET_MIB},
        "met": {"upload": growth_mib <= UPLOAD_TARGET_MIB},
        "samples": {"handshake": handshakes, "renewal": [{k: v for k, v in r.items() if not k.endswith("_stats")}
                                                          for r in renewals],
                    "upload_ours": ours, "upload_naive": naive},
    }
    result["ratios"] = {
        "renewal_resumed_over_full": round(result["renewal_cpu_ms_per_call"]["resumed"]
                                           / result["renewal_cpu_ms_per_call"]["full"], 3),
        "handshake_resumed_over_full": round(result["handshake_raw_ssl_cpu_ms"]["resumed"]
                                             / result["handshake_raw_ssl_cpu_ms"]["full"], 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
