"""tests.support: the helpers every test tier uses."""

from __future__ import annotations

from tests.support import free_port


def test_free_port_never_names_one_port_twice() -> None:
    """Ports picked in a row are distinct even when the kernel offers a released one again
    (two LB frontends on one port split the test's connections between them)."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
