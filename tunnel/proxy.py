"""Reach the hub through an HTTP CONNECT proxy (``HTTPS_PROXY``/``NO_PROXY``), for agents in
networks whose only way out is an egress proxy (OCM's ``proxyConfig`` sets the same variables).

Sans-IO core, then a thin asyncio adapter:

* :func:`proxy_for` reads the environment: ``https_proxy`` (or ``HTTPS_PROXY``), an
  ``http://[user:password@]host[:port]`` URL (port 3128 when left out; a URL without a scheme is
  taken as http), unless ``no_proxy`` (or ``NO_PROXY``) matches the hub: ``*``, a host name or
  domain suffix (``example.com`` and ``.example.com`` both match ``hub.example.com``), an IP
  address, a CIDR block, each optionally with ``:port``.
* :func:`connect_request` builds the CONNECT request (``Proxy-Authorization: Basic`` from the
  URL's user information); :class:`ConnectResponse` parses the proxy's answer, refusing
  anything but a 2xx with a bounded, well-formed head.
* :func:`open_through_proxy` does both on a socket and returns it connected to the hub through
  the proxy; the caller then runs TLS to the hub inside it (the proxy sees only ciphertext).

The password never leaves :class:`ProxyConfig` except inside the request to the proxy: its repr
and :attr:`ProxyConfig.display` leave it out, and errors name the proxy by ``display``.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

DEFAULT_PROXY_PORT = 3128
MAX_RESPONSE_HEAD = 16 * 1024  # a CONNECT answer is a status line and a few headers


class ProxyError(Exception):
    """The proxy could not be used: bad configuration, unreachable, or it refused."""


class ProxyRefused(ProxyError):
    """The proxy answered the CONNECT with a non-2xx status."""

    def __init__(self, status: int, reason: str) -> None:
        # 407 is the standard answer to missing or wrong credentials; some proxies (tinyproxy)
        # answer CONNECT with 401 instead.
        auth = " (proxy authentication required or wrong: check the user and password in " \
               "HTTPS_PROXY)"
        hint = {407: auth, 401: auth,
                403: " (the proxy does not allow this destination or port)"}.get(status, "")
        super().__init__(f"the proxy refused the CONNECT: {status} {reason[:80]}{hint}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class ProxyConfig:
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = "HTTPS_PROXY"  # the variable it came from, for the log

    @property
    def display(self) -> str:
        """``http://host:port`` (and the user name, never the password)."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{user}{host}:{self.port}"


def parse_proxy_url(url: str, source: str = "HTTPS_PROXY") -> ProxyConfig:
    """A proxy URL as curl and Go read it; refuses schemes other than http."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme.lower() != "http":
        raise ProxyError(f"{source}: only http:// CONNECT proxies are supported, not "
                         f"{parts.scheme}://")
    try:
        port = parts.port or DEFAULT_PROXY_PORT
    except ValueError:
        raise ProxyError(f"{source}: the proxy port is not a number") from None
    if not parts.hostname:
        raise ProxyError(f"{source}: no proxy host")
    return ProxyConfig(
        host=parts.hostname, port=port,
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        source=source)


def _env(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """Lower case wins, as in curl and Python's urllib; empty means unset."""
    for key in (name.lower(), name.upper()):
        value = environ.get(key, "").strip()
        if value:
            return key, value
    return None


def bypasses_proxy(no_proxy: str, host: str, port: int) -> bool:
    """Does a NO_PROXY list match ``host:port``?"""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = (
            ipaddress.ip_address(host))
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.startswith("["):  # [v6]:port
            inner, _, rest = entry[1:].partition("]")
            entry = inner
            if rest.startswith(":") and rest[1:].isdigit():
                entry_port = int(rest[1:])
        elif entry.count(":") == 1:
            name, _, maybe_port = entry.partition(":")
            if maybe_port.isdigit():
                entry, entry_port = name, int(maybe_port)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        domain = entry.lstrip("*").lstrip(".").rstrip(".")
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def proxy_for(environ: Mapping[str, str], host: str, port: int) -> ProxyConfig | None:
    """The proxy to reach ``host:port`` through, per the environment, or None (dial directly)."""
    found = _env(environ, "HTTPS_PROXY")
    if found is None:
        return None
    no_proxy = _env(environ, "NO_PROXY")
    if no_proxy is not None and bypasses_proxy(no_proxy[1], host, port):
        return None
    return parse_proxy_url(found[1], source=found[0])


def connect_request(host: str, port: int, proxy: ProxyConfig) -> bytes:
    """The CONNECT request for ``host:port`` (Basic credentials if the URL had user info)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.username is not None:
        token = base64.b64encode(
            f"{proxy.username}:{proxy.password or ''}".encode()).decode("ascii")
        lines.append(f"Proxy-Authorization: Basic {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")


class ConnectResponse:
    """Parses the proxy's answer to CONNECT, fed in pieces.

    :meth:`feed` returns False until the head is complete, then True (status 2xx: the tunnel
    is open); raises :class:`ProxyRefused` for any other status and :class:`ProxyError` for a
    malformed or oversized head, or bytes after it (the proxy may not speak for the hub).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status = 0
        self.reason = ""

    def feed(self, data: bytes) -> bool:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_RESPONSE_HEAD:
                raise ProxyError("the proxy's answer to CONNECT is too long")
            return False
        head, rest = bytes(self._buf[:end]), bytes(self._buf[end + 4:])
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        version, _, tail = status_line.partition(" ")
        code, _, reason = tail.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProxyError(f"the proxy did not answer CONNECT with HTTP: {status_line[:80]!r}")
        self.status, self.reason = int(code), reason.strip()
        if not 200 <= self.status < 300:
            raise ProxyRefused(self.status, self.reason)
        if rest:
            raise ProxyError("the proxy sent data before the hub did")
        return True


async def open_through_proxy(proxy: ProxyConfig, host: str, port: int,
                             timeout: float) -> socket.socket:
    """A socket connected to ``host:port`` through the proxy's CONNECT, ready for TLS."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProxyError(f"cannot resolve the proxy {proxy.display}: "
                         f"{exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(timeout):
            try:
                await loop.sock_connect(sock, address)
            except OSError as exc:
                raise ProxyError(f"cannot connect to the proxy {proxy.display}: "
                                 f"{exc.strerror or exc}") from None
            await loop.sock_sendall(sock, connect_request(host, port, proxy))
            response = ConnectResponse()
            while True:
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk:
                    raise ProxyError(f"the proxy {proxy.display} closed the connection "
                                     "before answering CONNECT")
                if response.feed(chunk):
                    return sock
    except TimeoutError:
        sock.close()
        raise ProxyError(f"the proxy {proxy.display} did not open the tunnel within "
                         f"{timeout:g}s") from None
    except BaseException:
        sock.close()
        raise
