"""Load for ``python -m bench fleet``: small GETs to random clusters through the front door.

Two generators, both with a real hub bearer token:

* **steady** (this module run as a process, ``python -m bench.fleetload``): an aiohttp client
  sending ``rate`` GETs a second, evenly spaced, each to a cluster drawn at random, on keep-alive
  connections (at most ``MAX_OUTSTANDING`` at once; a request that would exceed it is counted as
  ``skipped``, not queued, so a stalled gateway does not build a backlog that bursts later).
  Every request is recorded: when it was sent (``time.monotonic``, the machine's
  CLOCK_MONOTONIC), its latency, its cluster and its outcome (the HTTP status, or a negative
  code for a connection error or a timeout), written to ``--out`` as JSON on ``quit``. Commands
  on stdin: ``rate R`` (0 pauses), ``quit``.
* **closed loop** (:func:`closed_loop`): ``wrk`` with ``connections`` keep-alive connections
  and a Lua script that picks a random cluster per request and counts statuses; its summary
  gives requests/s and p50/p99.

The steady generator runs throughout (connect, storm); the closed loop measures latency with
every cluster connected; both stop for the idle-CPU measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.fleetpki import cluster_name

PATH = "/api/v1/namespaces/default/pods/bench"  # bench.upstream's ~1 KiB Pod
TIMEOUT = 10.0
MAX_OUTSTANDING = 64
CONNECTION_ERROR, TIMEOUT_ERROR = -1, -2


class Steady:
    def __init__(self, url: str, cafile: str, token: str, clusters: int) -> None:
        self.url = url
        self.cafile = cafile
        self.token = token
        self.clusters = clusters
        self.rate = 0.0
        self.changed = asyncio.Event()
        self.outstanding = 0
        self.skipped = 0
        # Parallel lists (cheaper than one object per request): sent, latency, cluster, outcome.
        self.sent: list[float] = []
        self.latency: list[float] = []
        self.cluster: list[int] = []
        self.outcome: list[int] = []

    async def run(self) -> None:
        import aiohttp

        context = ssl.create_default_context(cafile=self.cafile)
        connector = aiohttp.TCPConnector(ssl=context, limit=MAX_OUTSTANDING)
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            while True:
                if self.rate <= 0:
                    self.changed.clear()
                    await self.changed.wait()
                    next_at = time.monotonic()
                    continue
                now = time.monotonic()
                if next_at > now:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), next_at - now)
                    if self.changed.is_set():
                        self.changed.clear()
                        next_at = time.monotonic()
                    continue
                next_at += 1.0 / self.rate
                if self.outstanding >= MAX_OUTSTANDING:
                    self.skipped += 1
                    continue
                task = asyncio.ensure_future(self.one(session, random.randrange(self.clusters)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def one(self, session: Any, index: int) -> None:
        import aiohttp

        self.outstanding += 1
        started = time.monotonic()
        try:
            async with session.get(f"{self.url}/{cluster_name(index)}{PATH}",
                                   headers={"Authorization": f"Bearer {self.token}"}) as answer:
                await answer.read()
                outcome = answer.status
        except TimeoutError:
            outcome = TIMEOUT_ERROR
        except (aiohttp.ClientError, OSError):
            outcome = CONNECTION_ERROR
        finally:
            self.outstanding -= 1
        self.sent.append(started)
        self.latency.append(time.monotonic() - started)
        self.cluster.append(index)
        self.outcome.append(outcome)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({"sent": self.sent, "latency": self.latency,
                                    "cluster": self.cluster, "outcome": self.outcome,
                                    "skipped": self.skipped}))


async def serve(args: argparse.Namespace) -> int:
    token = Path(args.token_file).read_text().strip()
    steady = Steady(args.url, args.ca, token, args.clusters)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    runner = asyncio.ensure_future(steady.run())
    print("fleetload ready", flush=True)
    while True:
        line = (await reader.readline()).decode().split()
        if not line or line[0] == "quit":
            break
        if line[0] == "rate":
            steady.rate = float(line[1])
            steady.changed.set()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    steady.dump(Path(args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleetload",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="https://HOST:PORT of the front door")
    parser.add_argument("--ca", required=True, help="CA of the front door")
    parser.add_argument("--token-file", required=True, help="the hub bearer token")
    parser.add_argument("--clusters", type=int, required=True)
    parser.add_argument("--out", required=True, help="where the records go on quit")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(args))
    return uvloop.run(serve(args))


# --- closed loop (wrk) -----------------------------------------------------------------------

_WRK_SCRIPT = r"""
wrk.headers["Authorization"] = "Bearer %(token)s"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {}; math.randomseed(os.time()) end
function request()
  return wrk.format(nil, string.format("/fleet-%%05d%(path)s", math.random(0, %(last)d)))
end
function response(status, headers, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
end
function done(summary, latency, requests)
  local parts = {}
  for _, thread in ipairs(threads) do
    for code, n in pairs(thread:get("statuses")) do parts[code] = (parts[code] or 0) + n end
  end
  local text = {}
  for code, n in pairs(parts) do table.insert(text, string.format('"%%s":%%d', code, n)) end
  io.write(string.format('WRKJSON {"requests":%%d,"duration_us":%%d,"p50_us":%%.1f,' ..
    '"p99_us":%%.1f,"max_us":%%.1f,"errors":%%d,"statuses":{%%s}}\n', summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, table.concat(text, ",")))
end
"""


def closed_loop(wrk: str, url: str, token: str, clusters: int, workdir: Path, *,
                connections: int, seconds: float) -> dict[str, Any]:
    """``wrk`` for ``seconds`` against random clusters: its summary, with its own CPU seconds
    (``wrk_cpu_s``, from the children's rusage: the caller reaps no other child meanwhile)."""
    script = workdir / "fleet-wrk.lua"
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:  # it holds the token
        out.write(_WRK_SCRIPT % {"token": token, "path": PATH, "last": clusters - 1})
    args = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
            "--timeout", f"{TIMEOUT:g}s", "-s", str(script), f"{url}{PATH}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
    try:
        out_text, err_text = popen.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        popen.send_signal(signal.SIGKILL)
        out_text, err_text = popen.communicate()
    finally:
        script.unlink(missing_ok=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((x for x in out_text.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary ({popen.returncode}): {out_text[-500:]} "
                           f"{err_text[-500:]}")
    raw = json.loads(line[len("WRKJSON "):])
    seconds_run = raw["duration_us"] / 1e6
    ok = sum(n for code, n in raw["statuses"].items() if code.startswith("2"))
    return {"requests": raw["requests"], "ok": ok, "seconds": round(seconds_run, 2),
            "rps": round(raw["requests"] / seconds_run, 1) if seconds_run else 0.0,
            "failed": raw["requests"] - ok + raw["errors"], "statuses": raw["statuses"],
            "socket_errors": raw["errors"], "p50_ms": round(raw["p50_us"] / 1000, 2),
            "p99_ms": round(raw["p99_us"] / 1000, 2),
            "max_ms": round(raw["max_us"] / 1000, 2), "wrk_cpu_s": round(cpu, 2)}


if __name__ == "__main__":
    sys.exit(main())
