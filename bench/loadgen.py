"""Load generators: ``wrk`` for small GETs, ``curl`` for bodies/watches/TTFB, and an asyncio
client that holds many idle watches open (``python -m bench.loadgen idle-watches ...``).

Every client run records its own CPU time (``os.wait4`` rusage) next to the wall time, so the
report can show that the client was not the bottleneck (``client_cpu_util`` = client CPU seconds
/ (wall seconds * threads it may use)).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.ops.rlimits import raise_open_file_limit

WRK = shutil.which("wrk")
CURL = shutil.which("curl")


@dataclass
class Target:
    """How a client reaches one configuration."""

    base: str  # scheme://host:port[/prefix], no trailing slash
    cafile: str | None = None  # None: plain http
    token: str | None = None

    def url(self, path: str) -> str:
        return self.base + path

    def curl_args(self) -> list[str]:
        args = ["--cacert", self.cafile] if self.cafile else []
        if self.token:
            args += ["-H", f"Authorization: Bearer {self.token}"]
        return args


def run_timed(args: list[str], timeout: float) -> tuple[int, str, str, float, float]:
    """Run a client; returns (exit code, stdout, stderr, wall s, client CPU s)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.002)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), wall, usage.ru_utime + usage.ru_stime)


# wrk -------------------------------------------------------------------------------------------

_WRK_DONE = r"""
done = function(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f,' ..
    '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max,
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout))
end
"""


def wrk_script(token: str | None, paths: list[str] | None = None) -> str:
    """A Lua script: the Authorization header, optional path rotation, and a JSON summary."""
    lines = []
    if token:
        lines.append(f'wrk.headers["Authorization"] = "Bearer {token}"')
    if paths:
        quoted = ", ".join(json.dumps(p) for p in paths)
        lines += [f"local paths = {{{quoted}}}", "local i = 0",
                  "request = function()", "  i = i + 1",
                  "  return wrk.format(nil, paths[(i % #paths) + 1])", "end"]
    return "\n".join(lines) + _WRK_DONE


def wrk(target: Target, path: str, *, connections: int, threads: int, seconds: float,
        workdir: Path, paths: list[str] | None = None) -> dict[str, Any]:
    """Closed-loop keep-alive GETs; req/s, latency percentiles, errors, client CPU."""
    if WRK is None:
        raise RuntimeError("wrk is not installed (apt-get install -y wrk)")
    threads = max(1, min(threads, connections))
    script = workdir / f"wrk-{os.getpid()}-{time.monotonic_ns()}.lua"
    script.write_text(wrk_script(target.token, paths))
    seconds = max(1, round(seconds))  # wrk takes whole seconds
    args = [WRK, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
            "-s", str(script), target.url(path)]
    try:
        code, out, err, wall, cpu = run_timed(args, seconds + 30)
    finally:
        script.unlink(missing_ok=True)
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if code != 0 or line is None:
        raise RuntimeError(f"wrk failed ({code}): {out[-800:]} {err[-800:]}")
    result = json.loads(line[len("WRKJSON "):])
    duration = result["duration_us"] / 1e6
    errors = sum(v for k, v in result.items() if k.startswith("err_"))
    return {
        "rps": result["requests"] / duration if duration else 0.0,
        "requests": result["requests"],
        "p50_ms": result["p50_us"] / 1000, "p90_ms": result["p90_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000, "mean_ms": result["mean_us"] / 1000,
        "max_ms": result["max_us"] / 1000, "errors": errors,
        "error_detail": {k: v for k, v in result.items() if k.startswith("err_") and v},
        "connections": connections, "threads": threads, "seconds": duration,
        "client_cpu_util": cpu / (wall * threads) if wall else 0.0,
    }


# h2load (HTTP/2) -------------------------------------------------------------------------------

H2LOAD = shutil.which("h2load")


def h2load(target: Target, path: str, *, clients: int, streams: int, seconds: float
           ) -> dict[str, Any]:
    """Closed-loop GETs over HTTP/2 (nghttp2's h2load): ``clients`` connections, ``streams``
    concurrent streams on each; req/s, mean latency, p50/p99 (from h2load's per-request log;
    it prints no percentiles itself), errors."""
    if H2LOAD is None:
        raise RuntimeError("h2load is not installed (apt-get install -y nghttp2-client)")
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log") as requests_log:
        args = [H2LOAD, "-c", str(clients), "-m", str(streams), "-t", "1",
                # No --warm-up-time: like wrk, every request counts, so the CPU measured over
                # the whole run divides by all of them.
                "-D", str(max(1, round(seconds))), "--log-file", requests_log.name]
        if target.token:
            args += ["-H", f"authorization: Bearer {target.token}"]
        args.append(target.url(path))
        code, out, err, wall, cpu = run_timed(args, seconds + 60)
        # One line per request: start (us since the epoch), status, duration (us).
        durations = sorted(int(line.split()[2]) for line in Path(requests_log.name)
                           .read_text().splitlines() if len(line.split()) == 3)
    if code != 0 or "finished in" not in out:
        raise RuntimeError(f"h2load failed ({code}): {out[-800:]} {err[-800:]}")
    finished = re.search(r"finished in [^,]+, ([0-9.]+) req/s", out)
    assert finished is not None
    rps = float(finished.group(1))
    done = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                     r"(\d+) failed, (\d+) errored", out)
    assert done is not None
    status = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    timing = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    protocol = re.search(r"Application protocol: (\S+)", out)
    return {
        "rps": rps, "requests": int(done.group(3)),
        "errors": int(done.group(5)) + int(done.group(6))
        + (int(status.group(3)) + int(status.group(4)) if status else 0),
        "mean_ms": _ms(timing.group(3)) if timing else None,
        "p50_ms": _percentile(durations, 0.50) / 1000 if durations else None,
        "p99_ms": _percentile(durations, 0.99) / 1000 if durations else None,
        "max_ms": _ms(timing.group(2)) if timing else None,
        "protocol": protocol.group(1) if protocol else "?",
        "clients": clients, "streams": streams,
        "client_cpu_util": cpu / wall if wall else 0.0,
    }


def _percentile(ordered: list[int], q: float) -> float:
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _ms(value: str) -> float:
    for unit, factor in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if value.endswith(unit):
            return float(value[:-len(unit)]) * factor
    return float(value)


# curl ------------------------------------------------------------------------------------------

_CURL_FORMAT = ('{"code":%{http_code},"size":%{size_download},"speed":%{speed_download},'
                '"connect":%{time_connect},"appconnect":%{time_appconnect},'
                '"ttfb":%{time_starttransfer},"total":%{time_total}}')


def curl(target: Target, path: str, timeout: float = 120.0, http2: bool = False
         ) -> dict[str, Any]:
    """One GET with a fresh connection, body discarded; curl's own timings + client CPU.
    HTTP/1.1 unless ``http2`` (curl would pick h2 wherever ALPN offers it, and the comparison
    with the other configurations is HTTP/1.1)."""
    if CURL is None:
        raise RuntimeError("curl is not installed")
    args = [CURL, "-sS", "-o", "/dev/null", "--max-time", f"{timeout:g}", "-w", _CURL_FORMAT,
            "--http2" if http2 else "--http1.1", *target.curl_args(), target.url(path)]
    code, out, err, wall, cpu = run_timed(args, timeout + 10)
    if code != 0:
        raise RuntimeError(f"curl {path} failed ({code}): {err[-500:]}")
    result = json.loads(out)
    if result["code"] != 200:
        raise RuntimeError(f"curl {path}: HTTP {result['code']}")
    result["client_cpu_util"] = cpu / wall if wall else 0.0
    return result


# idle watches ----------------------------------------------------------------------------------

async def _open_watch(host: str, port: int, ctx: ssl.SSLContext | None, head: bytes,
                      timeout: float) -> tuple[asyncio.StreamWriter | None, str]:
    """Open one watch and wait for its first event; returns (writer to keep, outcome)."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx,
                                    server_hostname="localhost" if ctx else None), timeout)
    except (TimeoutError, OSError) as exc:
        return None, f"connect: {type(exc).__name__}"
    try:
        writer.write(head)
        buf = b""
        deadline = time.monotonic() + timeout
        while b"MODIFIED" not in buf:
            if b"\r\n\r\n" in buf and not buf.startswith(b"HTTP/1.1 200 "):
                break  # refused (e.g. 429): no event will come on this connection
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            data = await asyncio.wait_for(reader.read(65536), left)
            if not data:
                break
            buf += data
            if len(buf) > 1 << 20:
                break
        status = buf[9:12].decode(errors="replace") if buf.startswith(b"HTTP/1.1 ") else "?"
        if status == "200" and b"MODIFIED" in buf:
            return writer, "200"
        writer.close()
        return None, status
    except (TimeoutError, OSError) as exc:
        writer.close()
        return None, f"read: {type(exc).__name__}"


async def idle_watches(url: str, count: int, cafile: str | None, token: str | None,
                       parallel: int, timeout: float, hold: float) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    ctx = None
    if parts.scheme == "https":
        ctx = ssl.create_default_context(cafile=cafile)
    target = parts.path + ("?" + parts.query if parts.query else "")
    head = (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n").encode()
    gate = asyncio.Semaphore(parallel)
    outcomes: dict[str, int] = {}
    kept: list[asyncio.StreamWriter] = []

    async def one() -> None:
        async with gate:
            writer, outcome = await _open_watch(parts.hostname or "127.0.0.1", parts.port or 443,
                                                ctx, head, timeout)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if writer is not None:
            kept.append(writer)

    start = time.monotonic()
    await asyncio.gather(*(one() for _ in range(count)))
    print("IDLEJSON " + json.dumps({"open": len(kept), "requested": count, "outcomes": outcomes,
                                    "open_seconds": time.monotonic() - start}), flush=True)
    # Hold them until the harness says so (a line on stdin, or EOF) or ``hold`` seconds pass.
    loop = asyncio.get_running_loop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), hold)
    for writer in kept:
        writer.close()
    print("IDLECLOSED", flush=True)


async def idle_watches_h2(url: str, count: int, connections: int, cafile: str | None,
                          token: str | None, parallel: int, timeout: float, hold: float) -> None:
    """Like :func:`idle_watches`, over HTTP/2: ``count`` watches as streams spread over
    ``connections`` h2 connections, each stream waiting for its first event; at most
    ``parallel`` watches opening at once over all connections (as the HTTP/1.1 client)."""
    from urllib.parse import urlsplit

    import h2.config
    import h2.connection
    import h2.events

    parts = urlsplit(url)
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["h2"])
    target = parts.path + ("?" + parts.query if parts.query else "")
    headers = [(b":method", b"GET"), (b":scheme", b"https"),
               (b":authority", parts.netloc.encode()), (b":path", target.encode())]
    if token:
        headers.append((b"authorization", b"Bearer " + token.encode()))
    outcomes: dict[str, int] = {}
    kept: list[asyncio.StreamWriter] = []
    gate = asyncio.Semaphore(parallel)
    opened = 0

    def count_outcome(key: str, n: int = 1) -> None:
        outcomes[key] = outcomes.get(key, 0) + n

    async def one_connection(n: int) -> None:
        nonlocal opened
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                parts.hostname, parts.port or 443, ssl=ctx, server_hostname="localhost"),
                timeout)
        except (TimeoutError, OSError) as exc:
            count_outcome(f"connect: {type(exc).__name__}", n)
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        waiting: dict[int, tuple[bytearray, asyncio.Future[str]]] = {}
        status: dict[int, bytes] = {}

        def settle(sid: int, outcome: str) -> None:
            entry = waiting.pop(sid, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(outcome)

        async def read() -> None:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    sid = getattr(event, "stream_id", 0)
                    if isinstance(event, h2.events.ResponseReceived):
                        status[sid] = dict(event.headers).get(b":status", b"?")
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, sid)
                        if sid in waiting:
                            waiting[sid][0].extend(event.data)
                            if b"MODIFIED" in waiting[sid][0]:
                                settle(sid, "200")
                    elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                        settle(sid, status.get(sid, b"reset").decode())
                writer.write(conn.data_to_send())
            for sid in list(waiting):
                settle(sid, "read: closed")

        reading = asyncio.ensure_future(read())

        async def one() -> None:
            nonlocal opened
            async with gate:
                sid = conn.get_next_available_stream_id()
                future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
                waiting[sid] = (bytearray(), future)
                conn.send_headers(sid, headers, end_stream=True)
                writer.write(conn.data_to_send())
                try:
                    outcome = await asyncio.wait_for(future, timeout)
                except TimeoutError:
                    outcome = "read: TimeoutError"
            count_outcome(outcome)
            if outcome == "200":
                opened += 1

        await asyncio.gather(*(one() for _ in range(n)))
        kept.append(writer)
        reading.add_done_callback(lambda task: task.cancelled() or task.exception())

    per = [count // connections + (1 if i < count % connections else 0)
           for i in range(connections)]
    start = time.monotonic()
    await asyncio.gather(*(one_connection(n) for n in per if n))
    print("IDLEJSON " + json.dumps({"open": opened, "requested": count, "outcomes": outcomes,
                                    "connections": connections, "protocol": "h2",
                                    "open_seconds": time.monotonic() - start}), flush=True)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), hold)
    for writer in kept:
        writer.close()
    print("IDLECLOSED", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    sub = parser.add_subparsers(dest="command", required=True)
    idle = sub.add_parser("idle-watches", help="open COUNT watches, wait for one event each, "
                                               "hold them until stdin has a line")
    idle.add_argument("url")
    idle.add_argument("--count", type=int, required=True)
    idle.add_argument("--cafile")
    idle.add_argument("--token-file")
    idle.add_argument("--parallel", type=int, default=200)
    idle.add_argument("--timeout", type=float, default=30.0, help="per watch")
    idle.add_argument("--hold", type=float, default=120.0, help="at most this long")
    idle.add_argument("--h2-connections", type=int, default=0,
                      help="HTTP/2: spread the watches as streams over this many connections "
                      "(0: HTTP/1.1, one connection per watch)")
    args = parser.parse_args(argv)
    raise_open_file_limit()
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        if args.h2_connections:
            runner.run(idle_watches_h2(args.url, args.count, args.h2_connections, args.cafile,
                                       token, args.parallel, args.timeout, args.hold))
        else:
            runner.run(idle_watches(args.url, args.count, args.cafile, token, args.parallel,
                                    args.timeout, args.hold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
