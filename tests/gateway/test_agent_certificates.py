"""Certificate trouble is visible (issue 12 item 5), with real gateway and agent processes.

An agent whose certificate is expired or from another CA keeps redialling (and a client whose
certificate from the right CA names no cluster connects three times); the gateway says
why at the default log level, once per reason and peer host per minute (not once per dial), the
agent says what the hub answered instead of "connected" / "session ended", the metrics count
the refusals by reason, and no log line carries key material. A good agent's certificate expiry
is published per cluster.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import layout
from certs.files import load_issued, write_pair
from certs.issue import _issue_leaf, create_ca, issue_agent
from gateway.demo import agent_args
from tests.gateway.hub.hubsim import agent_kubeconfig_file, hub_and_cluster, start_gateway
from tests.support import BackgroundProcess, ProcessGroup, free_port
from tunnel.connection import ALPN

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# How long the bad agents redial: with the agent's backoff (0.2 s doubling, full jitter) that
# is several dials each, which the gateway must report once.
REDIAL_WINDOW = 6.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    tunnel_ca = load_issued(root / "tunnel-ca" / "ca.crt", root / "tunnel-ca" / "ca.key")
    last_week = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=7)
    expired = root / "agents" / "expired"
    expired.mkdir()
    write_pair(expired, issue_agent(tunnel_ca, "c1", days=2, valid_from=last_week),
               tunnel_ca.cert, force=False)
    foreign = root / "agents" / "foreign"
    foreign.mkdir()
    write_pair(foreign, issue_agent(create_ca("some other CA", days=1), "c1", days=1),
               tunnel_ca.cert, force=False)
    # From the tunnel CA, for client auth, but without the hubproxy://cluster/ URI SAN.
    nameless = root / "agents" / "nameless"
    nameless.mkdir()
    write_pair(nameless, _issue_leaf(tunnel_ca, "c1", [x509.DNSName("c1.example")],
                                     ExtendedKeyUsageOID.CLIENT_AUTH, days=1, key_type="ec"),
               tunnel_ca.cert, force=False)
    return root


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def counter(metrics: str, reason: str) -> int:
    found = re.search(
        rf'^hubproxy_tunnel_handshake_failures_total{{reason="{reason}"}} (\d+)$', metrics, re.M)
    return int(found.group(1)) if found else 0


def key_fragments(pki: Path) -> list[str]:
    """A line of every private key's base64 body: none may appear in any log."""
    out = []
    for key in pki.rglob("tls.key"):
        body = [line for line in key.read_text().splitlines() if not line.startswith("-----")]
        out.append(body[0])
    return out


def agent(group: ProcessGroup, pki: Path, tls_dir: str, tunnel: int,
          kubeconfig: Path, health_listen: str = "off") -> BackgroundProcess:
    args = agent_args(pki, "c1", hub=f"127.0.0.1:{tunnel}", kubeconfig=kubeconfig,
                      health_listen=health_listen)
    args[args.index("--tls-dir") + 1] = str(pki / "agents" / tls_dir)
    return group.hubproxy(*args, "--allow-loopback-targets")


async def test_refused_agents_are_explained_once_and_counted(pki: Path, tmp_path: Path) -> None:
    async with hub_and_cluster(tmp_path) as sims:
        agent_kc = agent_kubeconfig_file(sims, tmp_path)
        front, tunnel, health = free_port(), free_port(), free_port()
        group = ProcessGroup()
        try:
            gateway = await start_gateway(group, pki, sims, front=front, tunnel=tunnel,
                                          health=health)
            expired_health = free_port()
            expired = agent(group, pki, "expired", tunnel, agent_kc,
                            health_listen=f"127.0.0.1:{expired_health}")
            foreign = agent(group, pki, "foreign", tunnel, agent_kc)
            # The agent refuses to start with a certificate that names no cluster, so that one
            # is presented by openssl, three times from one host.
            nameless = pki / "agents" / "nameless"
            for _ in range(3):
                client = await asyncio.create_subprocess_exec(
                    "openssl", "s_client", "-connect", f"127.0.0.1:{tunnel}", "-tls1_3",
                    "-alpn", ALPN, "-cert", str(nameless / "tls.crt"),
                    "-key", str(nameless / "tls.key"), "-CAfile", str(nameless / "ca.crt"),
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL)
                await asyncio.wait_for(client.wait(), 20)
            await asyncio.sleep(REDIAL_WINDOW)
            metrics = await asyncio.to_thread(scrape, health)

            # Each agent dialled several times; each failure was counted under its reason ...
            outputs = (f"--- gateway\n{gateway.output[-3000:]}\n--- expired\n"
                       f"{expired.output[-2000:]}\n--- foreign\n{foreign.output[-2000:]}")
            assert counter(metrics, "expired") >= 3, outputs
            assert counter(metrics, "unknown_ca") >= 3, outputs
            assert counter(metrics, "wrong_name") == 3, outputs
            # ... and the gateway said why once (one peer host, one reason: one line a minute).
            refused = [line for line in gateway.lines if "agent connection from" in line]
            assert len([line for line in refused if "(expired)" in line]) == 1, refused
            assert len([line for line in refused if "(unknown_ca)" in line]) == 1, refused
            assert any("WARNING" in line and "127.0.0.1:" in line
                       and "the agent certificate has expired" in line for line in refused)
            assert any("not signed by the tunnel CA" in line for line in refused), refused
            (nameless_line,) = [line for line in refused if "(wrong_name)" in line]
            assert "names no valid cluster" in nameless_line, nameless_line

            # The agents say what the hub answered, not "connected" then "session ended".
            for proc, why in ((expired, "our certificate has expired"),
                              (foreign, "not signed by a CA the hub trusts")):
                said = [line for line in proc.lines if "refused this agent" in line]
                assert said and why in said[0] and "WARNING" in said[0], proc.output[-2000:]
                assert len(said) == 1, said  # repeats within the minute are not logged
                assert not any("connected to the hub" in line for line in proc.lines)
                assert not any("hub session ended" in line for line in proc.lines)
            # Its /readyz says why it is not ready.
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{expired_health}/readyz", timeout=5)
                raise AssertionError("an agent the hub refuses must not be ready")
            except urllib.error.HTTPError as error:
                assert error.code == 503
                assert error.read().decode().strip() == (
                    "not connected to the hub: our certificate has expired (or is not valid "
                    "yet)")
            # The expired agent said so itself at start-up, from its own certificate file.
            assert any("the agent certificate" in line and "expired on" in line
                       for line in expired.lines), expired.output[-2000:]

            # A good agent connects; its certificate's expiry is published (the earliest of
            # the fleet's; per cluster with --cluster-metrics detailed).
            good = agent(group, pki, "c1", tunnel, agent_kc)
            await asyncio.to_thread(good.wait_for_line, "connected to the hub", 30)
            await asyncio.to_thread(gateway.wait_for_line, "cluster c1 connected", 30)
            not_after = x509.load_pem_x509_certificate(
                (pki / "agents" / "c1" / "tls.crt").read_bytes()).not_valid_after_utc
            metrics = await asyncio.to_thread(scrape, health)
            assert (f'hubproxy_agent_certificate_earliest_expiry_timestamp_seconds '
                    f'{not_after.timestamp():.0f}') in metrics, metrics

            logs = gateway.output + expired.output + foreign.output + good.output
            for fragment in key_fragments(pki):
                assert fragment not in logs
        finally:
            group.stop_all()
