"""`hubproxy gateway`: flags, environment, fail-closed start, and the real process against a
kubesim hub (TokenReview + SubjectAccessReview over kubernetes-asyncio, health, SIGTERM)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from certs import layout
from gateway.cli import apply_environment, build_parser
from gateway.demo import GATEWAY_USER, hub_rbac, write_private
from gateway.hub.serve import config_from_args
from kubesim.testing import run_kubesim_in_thread
from tests.support import ProcessGroup, free_port, wait_for_port

CMD = [sys.executable, "-m", "gateway.cli", "gateway"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    return root


def base_flags(pki: Path) -> list[str]:
    return ["--tls-dir", str(pki / "gateway"), "--tunnel-tls-dir", str(pki / "tunnel-server"),
            "--agent-ca", str(pki / "tunnel-ca" / "ca.crt")]


def test_help_explains_the_gateway_and_its_flags() -> None:
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for needle in ("/<cluster>", "--agent-ca", "REQUIRED", "--token-passthrough",
                   "--authorize", "HUBPROXY_LISTEN", "SIGTERM", "404 unknown cluster"):
        assert needle in out.stdout, needle


def test_refuses_to_start_without_agent_ca(pki: Path) -> None:
    flags = ["--tls-dir", str(pki / "gateway"), "--tunnel-tls-dir", str(pki / "tunnel-server")]
    out = subprocess.run([*CMD, *flags], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("HUBPROXY_")})
    assert out.returncode == 2 and "--agent-ca" in out.stderr


def test_refuses_to_start_with_a_missing_agent_ca_file(pki: Path) -> None:
    flags = [*base_flags(pki)[:4], "--agent-ca", str(pki / "nope.crt")]
    out = subprocess.run([*CMD, *flags], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "refusing to start" in out.stderr


def test_environment_sets_every_flag(pki: Path) -> None:
    parser = build_parser()
    apply_environment(parser, {
        "HUBPROXY_LISTEN": "127.0.0.1:19092", "HUBPROXY_TOKEN_CACHE_TTL": "500ms",
        "HUBPROXY_AUTHORIZE": "none", "HUBPROXY_TOKEN_PASSTHROUGH": "true",
        "HUBPROXY_AUDIENCE": "a,b", "HUBPROXY_AGENT_CA": str(pki / "tunnel-ca" / "ca.crt"),
        "HUBPROXY_HEALTH_LISTEN": "off", "HUBPROXY_IDENTITY_PREFIX": "hub1:",
    })
    args = parser.parse_args(["gateway", *base_flags(pki)[:4]])
    config = config_from_args(args)
    assert config.listen == ("127.0.0.1", 19092)
    assert config.token_cache_ttl == 0.5
    assert config.authorize == "none" and config.token_passthrough
    assert config.audiences == ("a", "b")
    assert config.health_listen is None
    assert config.identity_prefix == "hub1:"


def test_max_request_body_flag(pki: Path) -> None:
    parser = build_parser()
    default = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert default.limits.max_request_body == 3 * 1024 * 1024
    apply_environment(parser, {"HUBPROXY_MAX_REQUEST_BODY": "512Ki"})
    config = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert config.limits.max_request_body == 512 * 1024
    for bad in ("0", "-1", "3MB", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["gateway", *base_flags(pki), "--max-request-body", bad])


def test_rejects_a_prefix_that_could_reach_reserved_names(pki: Path) -> None:
    out = subprocess.run([*CMD, *base_flags(pki), "--identity-prefix", "system:"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--identity-prefix" in out.stderr


def _get(url: str, ctx: ssl.SSLContext | None = None, token: str | None = None
         ) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_gateway_process_against_kubesim_hub(pki: Path, tmp_path: Path) -> None:
    gateway_token = "gw-" + os.urandom(8).hex()
    with run_kubesim_in_thread(tmp_path, name="hub", users=[(gateway_token, GATEWAY_USER,
                                                             "gw-uid")],
                               rbac=hub_rbac()) as hub:
        user_token = hub.mint_token("demo", "demo", expiration_seconds=3600)
        nobody = hub.mint_token("demo", "nobody", expiration_seconds=3600)
        kubeconfig = write_private(tmp_path / "hub.kubeconfig",
                                   yaml.safe_dump(hub.kubeconfig(gateway_token)))
        front, health = free_port(), free_port()
        group = ProcessGroup()
        try:
            proc = group.hubproxy(
                "gateway", *base_flags(pki), "--listen", f"127.0.0.1:{front}",
                "--tunnel-listen", f"127.0.0.1:{free_port()}",
                "--health-listen", f"127.0.0.1:{health}", "--hub-kubeconfig", str(kubeconfig),
                "--unknown-cluster-grace", "0")
            proc.wait_for_line("hubproxy gateway ready", timeout=30)
            wait_for_port(health)
            assert _get(f"http://127.0.0.1:{health}/healthz") == (200, b"ok\n")
            deadline = time.monotonic() + 15
            while _get(f"http://127.0.0.1:{health}/readyz")[0] != 200:
                assert time.monotonic() < deadline, proc.output
                time.sleep(0.1)
            ctx = ssl.create_default_context(cafile=str(pki / "front-ca" / "ca.crt"))
            ctx.check_hostname = False
            base = f"https://127.0.0.1:{front}"
            bad = "bad-" + os.urandom(8).hex()
            assert _get(f"{base}/c1/api", ctx, bad)[0] == 401
            assert _get(f"{base}/c1/api", ctx, nobody)[0] == 403  # hub SAR says no
            status, body = _get(f"{base}/c1/api", ctx, user_token)
            assert status == 404 and b'"kind":"Status"' in body  # no agent ever connected
            metrics = _get(f"http://127.0.0.1:{health}/metrics")[1].decode()
            assert 'code="401"' in metrics and user_token not in metrics
            proc.signal(signal.SIGTERM)
            assert proc.popen.wait(15) == 0
            output = proc.final_output()
            assert user_token not in output and bad not in output
        finally:
            group.stop_all()


async def test_real_hub_token_review_and_sar_in_process(tmp_path: Path) -> None:
    """The production authenticator/authorizer (kubernetes-asyncio) behind the front door,
    against a kubesim hub; then the hub goes away: 503, never 401."""
    import json

    import trustme

    from gateway.hub.admission.auth import (
        KubeTokenReviewer,
        TokenAuthenticator,
        build_hub_api_client,
    )
    from gateway.hub.admission.authorize import SarAuthorizer
    from gateway.hub.app import Gateway
    from kubesim.testing import run_kubesim
    from tests.gateway.hub.test_frontdoor_harness import (
        FakeRegistry,
        FakeSession,
        echo_agent,
        make_config,
        parse_raw,
    )
    from tests.gateway.hub.test_frontdoor_harness import get as raw_get

    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    gateway_token = "gw-" + os.urandom(8).hex()
    async with run_kubesim(tmp_path, name="hub", users=[(gateway_token, GATEWAY_USER, "gw")],
                           rbac=hub_rbac()) as hub:
        user_token = hub.mint_token("demo", "demo", expiration_seconds=3600)
        nobody = hub.mint_token("demo", "nobody", expiration_seconds=3600)
        kubeconfig = write_private(tmp_path / "hub.kubeconfig",
                                   yaml.safe_dump(hub.kubeconfig(gateway_token)))
        api = await build_hub_api_client(str(kubeconfig))
        registry = FakeRegistry()
        session = FakeSession(echo_agent)
        registry.add("c1", session)
        gw = Gateway(make_config(authorize="sar", token_cache_ttl=0.0),
                     authenticator=TokenAuthenticator(KubeTokenReviewer(api), ttl=0.0),
                     authorizer=SarAuthorizer(api, 0.0), registry=registry, front_ssl=server)
        await gw.start()

        async def call(token: str) -> tuple[int, bytes]:
            import asyncio

            reader, writer = await asyncio.open_connection(
                "127.0.0.1", gw.front_port, ssl=client, server_hostname="localhost")
            writer.write(raw_get("/c1/api", token=token, close=True))
            data = await asyncio.wait_for(reader.read(-1), 10)
            writer.close()
            status, _, body = parse_raw(data)
            return status, body

        status, body = await call(user_token)
        assert status == 200
        meta = json.loads(body)["metadata"]
        assert meta["user"] == "cluster:hub:system:serviceaccount:demo:demo"
        assert (await call(nobody))[0] == 403  # hub SubjectAccessReview says no
        assert (await call("bad-" + os.urandom(4).hex()))[0] == 401
    # The hub is gone now (connection refused): fail closed with 503.
    try:
        status, body = await call(user_token)
        assert status == 503 and b"unavailable" in body
    finally:
        await gw.close()
        await api.close()


async def test_gateway_process_with_an_agent_on_its_tunnel(pki: Path, tmp_path: Path) -> None:
    """`hubproxy gateway` as a process; an agent (real Agent + TunnelSession, in-process) dials
    its tunnel port with the c1 certificate; curl reaches kubesim through both. SIGTERM
    drains: the agent's session ends and the gateway exits 0."""
    import asyncio
    import json

    from gateway.agent.agent import Agent
    from gateway.agent.kubeapi import from_kubeconfig
    from tests.gateway.agent.test_exchange import FakePolicy
    from tests.gateway.hub.hubsim import DEMO_USER, hub_and_cluster
    from tunnel.connection import ALPN, TunnelSession

    async with hub_and_cluster(tmp_path) as sims:
        managed, token = sims.managed, sims.user_token
        front, tunnel, health = free_port(), free_port(), free_port()
        group = ProcessGroup()
        try:
            proc = group.hubproxy(
                "gateway", *base_flags(pki), "--listen", f"127.0.0.1:{front}",
                "--tunnel-listen", f"127.0.0.1:{tunnel}", "--health-listen",
                f"127.0.0.1:{health}", "--hub-kubeconfig", str(sims.hub_kubeconfig),
                "--shutdown-timeout", "3")
            await asyncio.to_thread(proc.wait_for_line, "hubproxy gateway ready", 30)
            agent = Agent(cluster="c1", policy=FakePolicy((managed.host, managed.port), {}),
                          kube=from_kubeconfig(str(managed.write_kubeconfig(
                              tmp_path / "agent-kc", token=sims.agent_token))))
            ctx = ssl.create_default_context(cafile=str(pki / "agents" / "c1" / "ca.crt"))
            ctx.load_cert_chain(str(pki / "agents" / "c1" / "tls.crt"),
                                str(pki / "agents" / "c1" / "tls.key"))
            ctx.set_alpn_protocols([ALPN])
            _, session = await asyncio.get_running_loop().create_connection(
                lambda: TunnelSession(on_open=agent.on_open, name="agent"), "127.0.0.1",
                tunnel, ssl=ctx, server_hostname="localhost")
            url = f"https://127.0.0.1:{front}/c1/apis/authentication.k8s.io/v1/selfsubjectreviews"
            body = b""
            for _ in range(100):  # until the gateway registered the session
                curl = await asyncio.create_subprocess_exec(
                    "curl", "-sS", "--cacert", str(pki / "front-ca" / "ca.crt"), "-X", "POST",
                    "-H", f"Authorization: Bearer {token}", "-H",
                    "Content-Type: application/json", "-d",
                    '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}',
                    url, stdout=asyncio.subprocess.PIPE)
                body, _ = await asyncio.wait_for(curl.communicate(), 20)
                if b"SelfSubjectReview" in body:
                    break
                await asyncio.sleep(0.1)
            info = json.loads(body)["status"]["userInfo"]
            assert info["username"] == DEMO_USER
            assert all(token not in json.dumps(r.__dict__, default=str)
                       for r in managed.received)
            proc.signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await session.wait_closed()  # GOAWAY/drain closed the agent's session
                while proc.popen.poll() is None:
                    await asyncio.sleep(0.05)
            assert proc.popen.returncode == 0
        finally:
            group.stop_all()


def test_http2_flags(pki: Path) -> None:
    from gateway.hub.app import front_alpn

    parser = build_parser()
    default = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert default.limits.http2 and default.limits.max_h2_streams == 250
    assert front_alpn(default) == ["h2", "http/1.1"]
    apply_environment(parser, {"HUBPROXY_NO_HTTP2": "true", "HUBPROXY_MAX_H2_STREAMS": "32"})
    config = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert not config.limits.http2 and config.limits.max_h2_streams == 32
    assert front_alpn(config) == ["http/1.1"]


def test_tunnel_admission_flags_reach_the_listener(pki: Path) -> None:
    """--tunnel-max-handshakes and --tunnel-backlog (issue 22): defaults for a 10,000-agent hub,
    read from the environment like every flag, explained in --help."""
    from tunnel.admission import DEFAULT_BACKLOG, DEFAULT_MAX_HANDSHAKES

    parser = build_parser()
    default = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert (default.tunnel_max_handshakes, default.tunnel_backlog) == (
        DEFAULT_MAX_HANDSHAKES, DEFAULT_BACKLOG)
    apply_environment(parser, {"HUBPROXY_TUNNEL_MAX_HANDSHAKES": "8",
                               "HUBPROXY_TUNNEL_BACKLOG": "128"})
    config = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert (config.tunnel_max_handshakes, config.tunnel_backlog) == (8, 128)
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--tunnel-max-handshakes" in out and "--tunnel-backlog" in out
    assert "somaxconn" in out


async def test_the_gateway_listener_runs_with_the_admission_flags(pki: Path) -> None:
    from gateway.hub.app import Gateway, front_tls, session_settings, tunnel_tls
    from tunnel.admission import parse_listen_queue, tcp_info
    from tunnel.registry import SessionRegistry

    parser = build_parser()
    config = config_from_args(parser.parse_args([
        "gateway", *base_flags(pki), "--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
        "--health-listen", "off", "--authorize", "none", "--tunnel-max-handshakes", "3",
        "--tunnel-backlog", "77"]))
    gateway = Gateway(config, authenticator=None, authorizer=None,  # type: ignore[arg-type]
                      registry=SessionRegistry(), front_ssl=front_tls(config),
                      tunnel_ssl=tunnel_tls(config), session_config=session_settings(config))
    await gateway.start()
    try:
        listener = gateway.tunnel_listener
        assert listener.slots.limit == 3
        [sock] = listener.sockets
        raw = tcp_info(sock)
        assert raw is not None and parse_listen_queue(raw)[1] == 77
        admission = gateway.metrics.snapshot()["scalars"]["tunnel_admission"]
        assert admission["handshakes_in_flight"] == 0 and admission["refused_stale"] == 0
    finally:
        await gateway.close()


def test_real_client_and_kubernetes_audit_flags(pki: Path, tmp_path: Path) -> None:
    import ipaddress

    parser = build_parser()
    default = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert default.proxy_protocol_from == () and default.forwarded_for_from == ()
    assert default.audit_log_path is None and default.audit_webhook_config_file is None
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules: [{level: None, users: [bob]}, {level: Metadata}]\n")
    apply_environment(parser, {
        "HUBPROXY_PROXY_PROTOCOL_FROM": "10.0.0.0/8,192.0.2.7",
        "HUBPROXY_FORWARDED_FOR_FROM": "2001:db8::/64",
        "HUBPROXY_AUDIT_LOG_PATH": str(tmp_path / "audit.log"),
        "HUBPROXY_AUDIT_POLICY_FILE": str(policy),
        "HUBPROXY_AUDIT_WEBHOOK_BATCH_MAX_WAIT": "250ms",
        "HUBPROXY_AUDIT_WEBHOOK_BATCH_BUFFER_SIZE": "50",
    })
    config = config_from_args(parser.parse_args(["gateway", *base_flags(pki)]))
    assert config.proxy_protocol_from == (ipaddress.ip_network("10.0.0.0/8"),
                                          ipaddress.ip_network("192.0.2.7/32"))
    assert config.forwarded_for_from == (ipaddress.ip_network("2001:db8::/64"),)
    assert config.audit_log_path == str(tmp_path / "audit.log")
    assert config.audit_webhook.batch_max_wait == 0.25
    assert config.audit_webhook.buffer_size == 50
    assert config.audit_webhook.batch_max_size == 400  # kube-apiserver's default


@pytest.mark.parametrize(("flags", "message"), [
    (["--proxy-protocol-from", "10.0.0.0/33"], "--proxy-protocol-from '10.0.0.0/33': not an"),
    (["--forwarded-for-from", "ingress"], "--forwarded-for-from 'ingress'"),
    (["--audit-log-path", "x.log", "--audit-policy-file", "POLICY"],
     "rules[0]: level 'RequestResponse' is not supported"),
    (["--audit-policy-file", "POLICY"], "--audit-policy-file needs --audit-log-path or"),
    (["--audit-webhook-config-file", "/nonexistent/kubeconfig"],
     "--audit-webhook-config-file /nonexistent/kubeconfig: no such file"),
])
def test_bad_real_client_or_audit_flags_stop_the_start(pki: Path, tmp_path: Path,
                                                       flags: list[str], message: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules: [{level: RequestResponse}]\n")
    flags = [str(policy) if flag == "POLICY" else flag for flag in flags]
    out = subprocess.run([*CMD, *base_flags(pki), *flags], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
