"""Steady load for ``python -m bench ha``: watches and paced probes (aiohttp), and wrk windows.

Everything a client sees is recorded as an :class:`Observation` with a monotonic timestamp, so
the benchmark attributes it to the event window it happened in:

* **watches** (``count`` of them, spread over the clusters): each is a fresh connection through
  the load balancer (``force_close``), so HAProxy spreads them over the instances. A watch that
  ends with a clean end of stream is opened again at once, as client-go does (``clean``); one
  that ends any other way (status other than 200, a reset, a truncated chunked body, a
  timeout) is an interruption (``error:<what>``), then opened again after 0.2 s;
* **probes**: ``workers`` loops of GETs, each on a fresh connection, paced (``interval``):
  they give failure timestamps that wrk cannot, hence "time to full service";
* **fresh tokens** (:meth:`Load.fresh_probe`): one request with a token the gateways have
  never seen (a hub outage must answer it 503 with Retry-After, at once).

wrk (:class:`WrkWindow`) adds the volume: keep-alive GETs from the start of an event until
SIGINT at its end, statuses counted by a Lua ``response`` hook.

The asyncio side runs on its own event loop in a thread (:meth:`Load.start`), so the benchmark's
main thread can start and signal processes meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.loadgen import WRK

WATCH_RETRY = 0.2  # seconds before a watch that failed is opened again
REQUEST_TIMEOUT = 10.0  # a probe not answered within this "hangs"


@dataclass(frozen=True)
class Observation:
    at: float  # time.monotonic()
    source: str  # "probe", "watch", "fresh"
    outcome: str  # "200", "503", "conn:ClientConnectorError", "clean", "error:reset", ...
    latency: float = 0.0
    retry_after: bool = False


@dataclass
class Load:
    base: str  # https://127.0.0.1:PORT of the load balancer's front door
    cafile: str
    token: str
    clusters: list[str]
    watches: int
    workers: int = 4
    interval: float = 0.2
    observations: list[Observation] = field(default_factory=list)
    open_watches: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _fresh_session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ha-load", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("load generator did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def since(self, start: float, end: float | None = None) -> list[Observation]:
        end = time.monotonic() if end is None else end
        return [o for o in list(self.observations) if start <= o.at < end]

    def fresh_probe(self, token: str, path: str) -> Observation:
        """One request with ``token`` (blocking; from the benchmark's thread)."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._fresh(token, path), self._loop)
        return future.result(REQUEST_TIMEOUT + 5)

    # --- the event loop's side ------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile)

    def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self._ssl(), force_close=True, limit=0)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=5, sock_read=None))

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self._session() as watch_session, self._session() as probe_session, \
                self._session() as fresh_session:
            self._fresh_session = fresh_session
            tasks = [asyncio.ensure_future(self._watch(watch_session, i))
                     for i in range(self.watches)]
            tasks += [asyncio.ensure_future(self._probe(probe_session, i))
                      for i in range(self.workers)]
            self._ready.set()
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _record(self, source: str, outcome: str, started: float,
                retry_after: bool = False) -> None:
        now = time.monotonic()
        self.observations.append(Observation(now, source, outcome, now - started, retry_after))

    def _headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def _watch(self, session: aiohttp.ClientSession, index: int) -> None:
        cluster = self.clusters[index % len(self.clusters)]
        url = f"{self.base}/{cluster}/api/v1/namespaces/default/configmaps?watch=1"
        await asyncio.sleep(index * 0.01)  # not all at once
        while True:
            started = time.monotonic()
            outcome = await self._one_watch(session, url)
            self._record("watch", outcome, started)
            if outcome != "clean":
                await asyncio.sleep(WATCH_RETRY)

    async def _one_watch(self, session: aiohttp.ClientSession, url: str) -> str:
        opened = False
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                response = await session.get(url, headers=self._headers())
            try:
                if response.status != 200:
                    await response.read()
                    return f"error:{response.status}"
                opened = True
                self.open_watches += 1
                async for line in response.content:
                    if b'"type":"ERROR"' in line.replace(b" ", b""):
                        return "error:ERROR event"
                return "clean"  # the chunked body ended with its last chunk
            finally:
                if opened:
                    self.open_watches -= 1
                response.release()
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return "error:timeout"
        except aiohttp.ClientPayloadError:
            return "error:truncated"
        except (aiohttp.ClientError, OSError) as exc:
            return f"error:{type(exc).__name__}"

    async def _probe(self, session: aiohttp.ClientSession, index: int) -> None:
        cluster = self.clusters[index % len(self.clusters)]
        url = f"{self.base}/{cluster}/api/v1/namespaces/default/configmaps/bench"
        await asyncio.sleep(index * self.interval / max(1, self.workers))
        while True:
            started = time.monotonic()
            outcome, retry_after = await self._get(session, url, self.token)
            self._record("probe", outcome, started, retry_after)
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def _get(self, session: aiohttp.ClientSession, url: str, token: str
                   ) -> tuple[str, bool]:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT), \
                    session.get(url, headers=self._headers(token)) as response:
                await response.read()
                return str(response.status), "Retry-After" in response.headers
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return "timeout", False
        except (aiohttp.ClientError, OSError) as exc:
            return f"conn:{type(exc).__name__}", False

    async def _fresh(self, token: str, path: str) -> Observation:
        assert self._fresh_session is not None
        started = time.monotonic()
        outcome, retry_after = await self._get(self._fresh_session, self.base + path, token)
        observation = Observation(time.monotonic(), "fresh", outcome,
                                  time.monotonic() - started, retry_after)
        self.observations.append(observation)
        return observation


# wrk --------------------------------------------------------------------------------------------

_WRK_SCRIPT = r"""
wrk.headers["Authorization"] = "Bearer %s"
local paths = {%s}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {}; i = 0 end
function request()
  i = i + 1
  return wrk.format(nil, paths[(i %% #paths) + 1])
end
function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end
function done(summary, latency, requests)
  local parts = {}
  for _, thread in ipairs(threads) do
    for code, n in pairs(thread:get("statuses")) do
      parts[code] = (parts[code] or 0) + n
    end
  end
  local text = {}
  for code, n in pairs(parts) do table.insert(text, string.format('"%%s":%%d', code, n)) end
  io.write(string.format('WRKJSON {"requests":%%d,"duration_us":%%d,"p50_us":%%.1f,' ..
    '"p99_us":%%.1f,"max_us":%%.1f,"connect":%%d,"read":%%d,"write":%%d,"timeout":%%d,' ..
    '"statuses":{%%s}}\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(99), latency.max, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout, table.concat(text, ",")))
end
"""


class WrkWindow:
    """wrk GETs from :meth:`start` until :meth:`stop` (SIGINT: wrk prints its summary), bounded
    by ``limit`` seconds in any case."""

    def __init__(self, base: str, token: str, paths: list[str], workdir: Path, *,
                 connections: int, limit: float) -> None:
        if WRK is None:
            raise RuntimeError("wrk is not installed (apt-get install -y wrk)")
        self.script = workdir / f"ha-wrk-{time.monotonic_ns()}.lua"
        fd = os.open(self.script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:  # it holds the token
            out.write(_WRK_SCRIPT % (token, ", ".join(json.dumps(p) for p in paths)))
        self.args = [WRK, "-t1", f"-c{connections}", f"-d{max(1, round(limit))}s",
                     "--timeout", f"{REQUEST_TIMEOUT:g}s", "-s", str(self.script), base + paths[0]]
        self.popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True)

    def stop(self) -> dict[str, Any]:
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGINT)
        try:
            out, err = self.popen.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, err = self.popen.communicate()
        self.script.unlink(missing_ok=True)
        line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
        if line is None:
            raise RuntimeError(f"wrk printed no summary ({self.popen.returncode}): "
                               f"{out[-800:]} {err[-800:]}")
        raw = json.loads(line[len("WRKJSON "):])
        failed: Counter[str] = Counter(
            {code: n for code, n in raw["statuses"].items() if not code.startswith("2")})
        for kind in ("connect", "read", "write", "timeout"):
            if raw[kind]:
                failed[f"wrk {kind} error"] += raw[kind]
        seconds = raw["duration_us"] / 1e6
        return {"requests": raw["requests"], "seconds": seconds,
                "rps": raw["requests"] / seconds if seconds else 0.0,
                "statuses": raw["statuses"], "failed": dict(failed),
                "p50_ms": raw["p50_us"] / 1000, "p99_ms": raw["p99_us"] / 1000,
                "max_ms": raw["max_us"] / 1000}
