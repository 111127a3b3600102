"""Every kustomization in deploy/ is admitted by a real kube-apiserver (server-side dry run).

Any directory under deploy/ with a kustomization.yaml is found (except kustomize Components, which
only other kustomizations use), so a base or overlay added later is checked without editing
this test. The CRDs from ../shared/crds are installed on the
hub first (the `fleet` fixture), for manifests of custom resources. The Namespaces a
kustomization declares are created for real first: a dry run does not persist them, and the
namespaced objects next to them would otherwise be refused as "namespace not found".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.realkube.binaries import REPO
from tests.realkube.conftest import Fleet

DEPLOY = REPO / "deploy"


def kind_of(directory: Path) -> str:
    return str(yaml.safe_load((directory / "kustomization.yaml").read_text()).get("kind", ""))


FOUND = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
# A Component (deploy/image, deploy/agent/profiles/*) renders only inside a kustomization that
# uses it; it is checked there, and test_every_component_is_used makes sure one does.
COMPONENTS = [d for d in FOUND if kind_of(d) == "Component"]
KUSTOMIZATIONS = [d for d in FOUND if d not in COMPONENTS]


def test_every_component_is_used() -> None:
    used = {(d / c).resolve() for d in KUSTOMIZATIONS
            for c in yaml.safe_load((d / "kustomization.yaml").read_text()).get("components", [])}
    assert DEPLOY / "agent" / "profiles" / "read-only" in COMPONENTS
    assert set(COMPONENTS) <= used, set(COMPONENTS) - used


def test_kustomizations_are_found() -> None:
    assert {DEPLOY / "hub", DEPLOY / "agent"} <= set(KUSTOMIZATIONS)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS,
                         ids=[str(p.relative_to(DEPLOY)) for p in KUSTOMIZATIONS])
def test_server_side_dry_run(fleet: Fleet, directory: Path) -> None:
    hub = fleet.hub
    rendered = list(yaml.safe_load_all(hub.admin("kustomize", str(directory))))
    assert rendered, f"{directory} renders nothing"
    for obj in rendered:
        if obj and obj.get("kind") == "Namespace":
            hub.apply(obj)
    done = hub.kubectl("apply", "--dry-run=server", "--validate=false", "-k", str(directory))
    assert done.returncode == 0, done.stderr
    # One "(server dry run)" line per object: the apiserver admitted each one.
    admitted = [line for line in done.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(admitted) == len([o for o in rendered if o]), done.stdout
