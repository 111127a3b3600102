"""tunnel.proxy, pure parts: the environment, NO_PROXY matching, the CONNECT request and the
parsing of the proxy's answer, fed byte by byte.

(With a real proxy: tests/gateway/test_agent_proxy.py.)
"""

from __future__ import annotations

import base64

import pytest

from tunnel.proxy import (
    MAX_RESPONSE_HEAD,
    ConnectResponse,
    ProxyError,
    ProxyRefused,
    bypasses_proxy,
    connect_request,
    parse_proxy_url,
    proxy_for,
)


def test_proxy_url_forms() -> None:
    p = parse_proxy_url("http://us%40er:p%3Ass@proxy.corp:8080")
    assert (p.host, p.port, p.username, p.password) == ("proxy.corp", 8080, "us@er", "p:ss")
    assert p.display == "http://us@er@proxy.corp:8080"
    assert "p:ss" not in repr(p) and "p:ss" not in p.display
    assert parse_proxy_url("proxy.corp").port == 3128  # no scheme, no port: curl's defaults
    assert parse_proxy_url("http://[fd00::1]:3128").display == "http://[fd00::1]:3128"
    for bad in ("https://proxy:443", "socks5://proxy:1080", "http://:3128", "http://p:port"):
        with pytest.raises(ProxyError):
            parse_proxy_url(bad)


def test_environment_lower_case_wins_and_blank_is_unset() -> None:
    env = {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:2"}
    assert proxy_for(env, "hub", 8091).host == "low"
    assert proxy_for({"https_proxy": " ", "HTTPS_PROXY": "http://up:2"}, "hub", 8091).host == "up"
    assert proxy_for({}, "hub", 8091) is None
    assert proxy_for({"HTTP_PROXY": "http://p:1"}, "hub", 8091) is None  # the tunnel is TLS
    assert proxy_for({"HTTPS_PROXY": "http://p:1", "no_proxy": "hub"}, "hub", 8091) is None


@pytest.mark.parametrize(("no_proxy", "host", "port", "bypass"), [
    ("*", "anything", 1, True),
    ("example.com", "hub.example.com", 8091, True),
    (".example.com", "hub.example.com", 8091, True),
    ("example.com", "example.com", 8091, True),
    ("example.com", "badexample.com", 8091, False),
    ("hub.example.com:8091", "hub.example.com", 8091, True),
    ("hub.example.com:443", "hub.example.com", 8091, False),
    ("10.0.0.0/8, 192.168.1.1", "10.2.3.4", 8091, True),
    ("10.0.0.0/8", "11.2.3.4", 8091, False),
    ("192.168.1.1", "192.168.1.1", 8091, True),
    ("[fd00::1]:8091", "fd00::1", 8091, True),
    ("fd00::/8", "fd00::1", 8091, True),
    ("localhost", "127.0.0.1", 8091, False),  # names are not resolved
    ("", "hub", 8091, False),
])
def test_no_proxy_matching(no_proxy: str, host: str, port: int, bypass: bool) -> None:
    assert bypasses_proxy(no_proxy, host, port) is bypass


def test_connect_request_with_and_without_credentials() -> None:
    plain = parse_proxy_url("http://proxy:3128")
    assert connect_request("hub.example", 8091, plain) == (
        b"CONNECT hub.example:8091 HTTP/1.1\r\nHost: hub.example:8091\r\n\r\n")
    auth = parse_proxy_url("http://agent:s3cret@proxy:3128")
    request = connect_request("fd00::1", 8091, auth)
    assert request.startswith(b"CONNECT [fd00::1]:8091 HTTP/1.1\r\n")
    token = base64.b64encode(b"agent:s3cret")
    assert b"Proxy-Authorization: Basic " + token + b"\r\n\r\n" in request


def test_response_parsed_byte_by_byte() -> None:
    response = ConnectResponse()
    answer = b"HTTP/1.1 200 Connection established\r\nProxy-Agent: x\r\n\r\n"
    assert not any(response.feed(answer[i:i + 1]) for i in range(len(answer) - 1))
    assert response.feed(answer[-1:]) is True
    assert (response.status, response.reason) == (200, "Connection established")


@pytest.mark.parametrize(("answer", "error", "text"), [
    (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", ProxyRefused, "authentication"),
    (b"HTTP/1.0 403 Forbidden\r\n\r\n", ProxyRefused, "does not allow"),
    (b"HTTP/1.1 502 Bad Gateway\r\n\r\n", ProxyRefused, "502 Bad Gateway"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", ProxyError, "did not answer CONNECT with HTTP"),
    (b"HTTP/1.1 200 OK\r\n\r\n\x16\x03", ProxyError, "sent data before the hub"),
])
def test_response_refusals(answer: bytes, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        ConnectResponse().feed(answer)


def test_response_head_is_bounded() -> None:
    response = ConnectResponse()
    with pytest.raises(ProxyError, match="too long"):
        for _ in range(MAX_RESPONSE_HEAD // 100 + 2):
            response.feed(b"X-Filler: " + b"a" * 88 + b"\r\n")
