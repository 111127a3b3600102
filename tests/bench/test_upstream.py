"""The benchmark's upstream answers over HTTP/2 as over HTTP/1.1, and counts what it served.

A real ``python -m bench.upstream`` process with a trustme certificate; over h2 the raw ``h2``
client of the front-door tests (real TLS, ALPN h2), over HTTP/1.1 curl.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from bench.upstream import EVENT, POD, read_stats
from tests.gateway.hub.h2client import H2Client
from tests.support import BackgroundProcess, ProcessGroup, free_port

POD_PATH = "/api/v1/namespaces/default/pods/bench"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[int, str, Path, int]]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    stats = tmp_path / "stats"
    stats.mkdir()
    port = free_port()
    group = ProcessGroup()
    try:
        proc: BackgroundProcess = group.start([
            sys.executable, "-m", "bench.upstream", "--listen", f"127.0.0.1:{port}",
            "--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"),
            "--workers", "1", "--stats-dir", str(stats)])
        line = proc.wait_for_line("upstream ready on", 30)
        worker = int(line.split("workers", 1)[1].split()[0])
        yield port, str(tmp_path / "ca.crt"), stats, worker
    finally:
        group.stop_all()


async def test_pod_log_and_watches_over_h2_streams(
        upstream: tuple[int, str, Path, int]) -> None:
    port, ca, stats, worker = upstream
    client = await H2Client.connect(port, ca)
    try:
        pod, log, watch = await asyncio.gather(
            client.request(POD_PATH),
            client.request(POD_PATH + "/log?bytes=3000000", timeout=20),
            client.request("/api/v1/namespaces/default/pods?watch=1&events=5"))
        assert pod.status == 200 and pod.ended and bytes(pod.body) == POD
        assert log.status == 200 and log.ended and len(log.body) == 3_000_000
        assert watch.status == 200 and watch.ended and bytes(watch.body) == EVENT * 5
        missing = await client.request("/nope")
        assert missing.status == 404 and missing.ended

        # hold=1: the event, then an idle stream that stays open (an idle watch).
        sid = client.start("/api/v1/namespaces/default/pods?watch=1&events=1&hold=1")
        held = await client.wait(sid, lambda r: bytes(r.body) == EVENT)
        await asyncio.sleep(0.3)
        assert held.status == 200 and not held.ended and held.reset is None
        seen = await asyncio.to_thread(read_stats, stats, [worker])
        assert seen["h2_open"] == 1 and seen["h2_streams_open"] == 1
        assert seen["h1_open"] == 0 and seen["h2_streams_total"] == 3  # log, watch, held
    finally:
        await client.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_http1_still_served_and_counted(upstream: tuple[int, str, Path, int]) -> None:
    port, ca, stats, worker = upstream
    out = subprocess.run(
        ["curl", "-sS", "--http1.1", "--cacert", ca, "-w", "\n%{http_version}",
         f"https://127.0.0.1:{port}{POD_PATH}"], capture_output=True, timeout=30, check=True)
    body, _, version = out.stdout.rpartition(b"\n")
    assert body == POD and version == b"1.1"
    seen = read_stats(stats, [worker])
    assert seen["h1_total"] == 1 and seen["h2_total"] == 0
