"""Print the clusters a gateway serves: its ``GET /clusters`` as a table.

    hubproxy clusters [--url http://127.0.0.1:8000] [-o table|json] [--state S] [--cluster C]

The gateway answers a page at a time (``?limit=&continue=``, as Kubernetes lists do); this
follows the pages, so the table (or the JSON document, pages joined) holds every cluster.

One row per cluster that connected since the gateway started: whether it is connected now,
its tunnel sessions (one per agent process per gateway process) and agent processes, the agent
versions, the slowest session's RTT, when the earliest agent certificate expires, the streams
open, and the last abnormal end of a session (peer dead, connection lost, protocol error).

``--url`` is the gateway's health port (``hubproxy gateway --health-listen``). That port is
plain HTTP and unauthenticated, so it should listen on a private address; to query a gateway
in a cluster, ``kubectl -n hubproxy port-forward deploy/hubproxy-gateway 8000`` first, or go
through an authenticating proxy in front of the port with ``--token-file`` and ``--cacert``.

A client of the health port's JSON, nothing more: it lives with the other tools for people
outside the gateway (``gateway.access``) and imports neither program.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

PAGE = 500  # clusters asked for per request

COLUMNS = ("CLUSTER", "STATUS", "SESSIONS", "INSTANCES", "VERSION", "RTT", "CERT EXPIRES",
           "STREAMS", "LAST ERROR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", metavar="URL",
                        help="the gateway's health port, as --health-listen sets it "
                        "(default: %(default)s)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or the JSON document as the gateway sends it")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="give up after this long (default: %(default)s)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="send this bearer token (for a health port behind an "
                        "authenticating proxy such as kube-rbac-proxy)")
    parser.add_argument("--cacert", metavar="FILE",
                        help="CA that verifies an https --url (default: system roots)")
    parser.add_argument("--state", choices=("connected", "disconnected"),
                        help="only clusters in this state (default: all)")
    parser.add_argument("--cluster", metavar="NAME",
                        help="only this cluster, with its sessions (-o json)")


def _ago(iso_time: str | None, now: float) -> str:
    if not iso_time:
        return ""
    seconds = now - _epoch(iso_time)
    return f"{_span(seconds)} ago" if seconds >= 0 else f"in {_span(-seconds)}"


def _epoch(iso_time: str) -> float:
    return datetime.strptime(iso_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def rows(document: dict[str, Any], now: float | None = None) -> list[tuple[str, ...]]:
    """The table's rows (without the header) from a ``/clusters`` document."""
    now = time.time() if now is None else now
    out = []
    for cluster in document.get("clusters", ()):
        connected = cluster.get("connected")
        status = "connected" if connected else "disconnected"
        if not connected and cluster.get("disconnected_at"):
            status += f" ({_ago(cluster['disconnected_at'], now)})"
        rtt = cluster.get("rtt_ms")
        expires = cluster.get("certificate_not_after")
        error = cluster.get("last_error") or ""
        if error and cluster.get("last_error_at"):
            error += f" ({_ago(cluster['last_error_at'], now)})"
        out.append((
            cluster.get("name", "?"),
            status,
            str(cluster.get("sessions", 0)),
            str(cluster.get("instances", 0)),
            ",".join(cluster.get("agent_versions") or ()) or "-",
            f"{rtt:.1f}ms" if rtt is not None else "-",
            f"{expires[:10]} ({_ago(expires, now)})" if expires else "-",
            str(cluster.get("active_streams", 0)),
            error or "-",
        ))
    return out


def table(document: dict[str, Any], now: float | None = None) -> str:
    body = rows(document, now)
    if not body:
        return "no cluster has connected to this gateway since it started\n"
    widths = [max(len(row[i]) for row in [COLUMNS, *body]) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             .rstrip() for row in [COLUMNS, *body]]
    return "\n".join(lines) + "\n"


def fetch(url: str, timeout: float, token_file: str | None = None,
          cacert: str | None = None, filters: dict[str, str] | None = None) -> dict[str, Any]:
    """The gateway's ``/clusters`` document, every page of it joined into one (``summary``
    from the first); ValueError with one printable line otherwise."""
    token = None
    if token_file:
        try:
            with open(token_file) as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc.strerror}") from None
    context = ssl.create_default_context(cafile=cacert) if url.startswith("https") else None
    query = {"limit": str(PAGE), **{k: v for k, v in (filters or {}).items() if v}}
    document: dict[str, Any] | None = None
    while True:
        page = _page(url, query, timeout, token, context)
        if document is None:
            document = page
        else:
            document["clusters"] += page.get("clusters", [])
        following = (page.get("metadata") or {}).get("continue")
        if not following:
            document.pop("metadata", None)
            return document
        if following == query.get("continue"):
            raise ValueError(f"{url}/clusters gave the same continue token twice")
        query["continue"] = following


def _page(url: str, query: dict[str, str], timeout: float, token: str | None,
          context: ssl.SSLContext | None) -> dict[str, Any]:
    request = urllib.request.Request(
        url.rstrip("/") + "/clusters?" + urllib.parse.urlencode(query),
        headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            page = json.loads(response.read())
            if not isinstance(page, dict) or not isinstance(page.get("clusters", []), list):
                raise ValueError("not a cluster list")
            return page
    except urllib.error.HTTPError as exc:
        hint = (" (a gateway older than /clusters, or not a gateway's health port)"
                if exc.code == 404 else "")
        if exc.code == 400:
            hint = ": " + exc.read(200).decode("utf-8", "replace").strip()
        raise ValueError(f"{url}/clusters answered {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ValueError(f"cannot reach {url}: {reason}; is a gateway's --health-listen "
                         "there? give --url") from None
    except ValueError:
        raise ValueError(f"{url}/clusters did not answer JSON") from None


def run(args: argparse.Namespace) -> int:
    try:
        document = fetch(args.url, args.timeout, args.token_file, args.cacert,
                         {"state": args.state or "", "cluster": args.cluster or ""})
    except ValueError as exc:
        print(f"hubproxy clusters: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        sys.stdout.write(table(document))
    return 0
