"""The Python consumer helper: provider choice, private exec configs, the plugin round trip."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest
import trustme

from gateway.access.clusterprofile import (
    AccessError,
    ExecCredentialSource,
    Provider,
    build_configuration,
    exec_config_for,
    exec_info,
    load_providers,
    parse_providers,
    select_provider,
)

PLUGIN = [sys.executable, "-m", "gateway.access.creds"]


def profile(*entries: dict[str, object], deprecated: tuple[dict[str, object], ...] = ()) -> dict:
    return {
        "metadata": {"name": "cluster1", "namespace": "fleet"},
        "status": {"accessProviders": list(entries), "credentialProviders": list(deprecated)},
    }


def cluster(server: str, ca_data: str = "", **extra: object) -> dict[str, object]:
    data: dict[str, object] = {
        "server": server,
        "extensions": [
            {"name": "client.authentication.k8s.io/exec", "extension": {"clusterName": "cluster1"}}
        ],
    }
    if ca_data:
        data["certificate-authority-data"] = ca_data
    data.update(extra)
    return data


def provider(name: str, **exec_extra: object) -> Provider:
    return Provider(name, {"apiVersion": "client.authentication.k8s.io/v1", "command": "x",
                           "provideClusterInfo": True, **exec_extra})


def test_first_provider_in_file_order_wins() -> None:
    cp = profile({"name": "b", "cluster": cluster("https://b")},
                 {"name": "a", "cluster": cluster("https://a")})
    chosen, chosen_cluster = select_provider(cp, [provider("a"), provider("b")])
    assert (chosen.name, chosen_cluster["server"]) == ("a", "https://a")
    chosen, _ = select_provider(cp, [provider("z"), provider("b"), provider("a")])
    assert chosen.name == "b"


def test_access_provider_beats_deprecated_credential_provider() -> None:
    cp = profile({"name": "a", "cluster": cluster("https://new")},
                 deprecated=({"name": "a", "cluster": cluster("https://old")},
                             {"name": "legacy", "cluster": cluster("https://legacy")}))
    assert select_provider(cp, [provider("a")])[1]["server"] == "https://new"
    assert select_provider(cp, [provider("legacy")])[1]["server"] == "https://legacy"


def test_no_match_is_an_error() -> None:
    with pytest.raises(AccessError, match="no matching access provider"):
        select_provider(profile({"name": "a", "cluster": cluster("https://a")}), [provider("b")])


def test_exec_config_is_deep_copied_per_call() -> None:
    shared = provider("a", args=["--x"], env=[{"name": "K", "value": "v"}])
    shared = Provider(shared.name, shared.exec_config, "Append", "Replace")
    extended = cluster(
        "https://a",
        extensions=[
            {"name": "clusterprofiles.multicluster.x-k8s.io/exec/additional-args",
             "extension": ["--cluster-arg"]},
            {"name": "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs",
             "extension": {"K": "from-profile"}},
        ],
    )
    first = exec_config_for(shared, extended)
    second = exec_config_for(shared, extended)
    assert first["args"] == ["--x", "--cluster-arg"] == second["args"]
    assert first["env"] == [{"name": "K", "value": "from-profile"}]
    first["args"].append("--mutated")
    assert shared.exec_config["args"] == ["--x"]
    assert exec_config_for(shared, cluster("https://a"))["args"] == ["--x"]


def test_exec_info_is_what_client_go_sends() -> None:
    info = exec_info("client.authentication.k8s.io/v1beta1", cluster("https://gw/c1", "Q0E="))
    assert info == {
        "kind": "ExecCredential",
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "spec": {
            "cluster": {
                "server": "https://gw/c1",
                "certificate-authority-data": "Q0E=",
                "config": {"clusterName": "cluster1"},
            },
            "interactive": False,
        },
    }


def test_provider_file_format(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"providers": [
        {"name": "hubproxy", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
                                             "command": "hubproxy-creds",
                                             "provideClusterInfo": True}}]}))
    assert [p.name for p in load_providers(path)] == ["hubproxy"]
    for bad in ({}, {"providers": [{"name": "x"}]}, {"providers": [{"execConfig": {}}]}):
        with pytest.raises(AccessError):
            parse_providers(bad)


async def test_plugin_round_trip_builds_configuration(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hub-sa-token")
    ca = trustme.CA()
    ca_data = base64.b64encode(ca.cert_pem.bytes()).decode()
    hub = Provider("hubproxy", {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": PLUGIN[0],
        "args": [*PLUGIN[1:], "--token-file", str(token_file)],
        "provideClusterInfo": True,
    })
    server = "https://127.0.0.1:9092/cluster1"
    cp = profile({"name": "hubproxy", "cluster": cluster(server, ca_data)})
    configuration = await build_configuration(cp, [hub])
    assert configuration.host == "https://127.0.0.1:9092/cluster1"
    assert Path(configuration.ssl_ca_cert).read_bytes() == ca.cert_pem.bytes()
    assert configuration.api_key["BearerToken"] == "hub-sa-token"
    token_file.write_text("rotated")  # opaque token, no expiry: kept until the process restarts
    await configuration.refresh_api_key_hook(configuration)
    assert configuration.api_key["BearerToken"] == "hub-sa-token"


async def test_plugin_failure_surfaces_its_message(tmp_path: Path) -> None:
    source = ExecCredentialSource(
        {"apiVersion": "client.authentication.k8s.io/v1", "command": PLUGIN[0],
         "args": [*PLUGIN[1:], "--token-file", str(tmp_path / "none")], "provideClusterInfo": True},
        cluster("https://gw/c1"),
    )
    with pytest.raises(AccessError, match="cannot read token file"):
        await source.get_token()
    no_info = ExecCredentialSource(
        {"apiVersion": "client.authentication.k8s.io/v1", "command": PLUGIN[0],
         "args": PLUGIN[1:]}, cluster("https://gw/c1"))
    with pytest.raises(AccessError, match="provideClusterInfo"):
        await no_info.get_token()
