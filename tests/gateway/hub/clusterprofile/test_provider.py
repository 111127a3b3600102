"""The access-provider entry: exactly one of ours, nothing else touched, CA not leaf."""

from __future__ import annotations

import base64

import pytest
import trustme

from gateway.hub.clusterprofile.provider import (
    NotACABundle,
    access_provider_entry,
    ca_certificates_only,
    merged_access_providers,
    status_patch,
)

FOREIGN = {"name": "open-cluster-management", "cluster": {"server": "https://ocm/c1"}}


def entry(server: str = "https://gw:9092/c1") -> dict[str, object]:
    return {"name": "hubproxy", "cluster": {"server": server}}


def test_entry_shape() -> None:
    made = access_provider_entry("hubproxy", "https://gw.example:9092/", "cluster1", b"PEM")
    assert made == {
        "name": "hubproxy",
        "cluster": {
            "server": "https://gw.example:9092/cluster1",
            "certificate-authority-data": base64.b64encode(b"PEM").decode(),
            "extensions": [
                {
                    "name": "client.authentication.k8s.io/exec",
                    "extension": {"clusterName": "cluster1"},
                }
            ],
        },
    }


def test_appends_ours_after_foreign_entries() -> None:
    assert merged_access_providers([FOREIGN], "hubproxy", entry()) == [FOREIGN, entry()]
    assert merged_access_providers(None, "hubproxy", entry()) == [entry()]


def test_replaces_in_place_and_drops_duplicates_of_ours() -> None:
    current = [entry("https://old/c1"), FOREIGN, entry("https://dup/c1")]
    assert merged_access_providers(current, "hubproxy", entry()) == [entry(), FOREIGN]


def test_unchanged_means_no_patch() -> None:
    assert merged_access_providers([FOREIGN, entry()], "hubproxy", entry()) is None
    assert merged_access_providers([FOREIGN], "hubproxy", None) is None


def test_remove_keeps_foreign() -> None:
    assert merged_access_providers([entry(), FOREIGN], "hubproxy", None) == [FOREIGN]


def test_status_patch_carries_resource_version_and_never_conditions() -> None:
    profile = {
        "metadata": {"name": "c1", "resourceVersion": "42"},
        "status": {"conditions": [{"type": "ControlPlaneHealthy"}], "accessProviders": [FOREIGN]},
    }
    patch = status_patch(profile, "hubproxy", entry())
    assert patch == {
        "metadata": {"resourceVersion": "42"},
        "status": {"accessProviders": [FOREIGN, entry()]},
    }


def test_status_patch_repairs_null_conditions() -> None:
    profile = {"metadata": {"name": "c1", "resourceVersion": "1"}, "status": {"conditions": None}}
    patch = status_patch(profile, "hubproxy", entry())
    assert patch is not None
    assert patch["status"]["conditions"] == []


def test_ca_bundle_keeps_ca_drops_leaf() -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("gw.example")
    bundle = leaf.cert_chain_pems[0].bytes() + ca.cert_pem.bytes()
    assert ca_certificates_only(bundle) == ca.cert_pem.bytes()
    with pytest.raises(NotACABundle):
        ca_certificates_only(leaf.cert_chain_pems[0].bytes())
    with pytest.raises(NotACABundle):
        ca_certificates_only(b"garbage")
