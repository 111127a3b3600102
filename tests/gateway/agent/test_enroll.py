"""The agent's certificate files: replaced at once, so the reloading context never mixes pairs."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from certs.files import cert_pem, key_pem
from certs.issue import create_ca, issue_agent
from certs.tls import TLS1_3, ReloadingContext, client_context
from gateway.agent.enroll import Credentials, write_tls_dir


def test_write_tls_dir_swaps_the_pair_in_one_step(tmp_path: Path) -> None:
    ca = create_ca("tunnel", days=1)
    first, second = (issue_agent(ca, "c1", days=1) for _ in range(2))
    d = tmp_path / "tls"
    write_tls_dir(d, Credentials(key_pem(first.key), cert_pem(first.cert), cert_pem(ca.cert)))
    assert oct(os.stat(d / "tls.key").st_mode & 0o777) == "0o600"
    files = [d / "ca.crt", d / "tls.crt", d / "tls.key"]
    reloading = ReloadingContext(lambda: client_context(*files, min_version=TLS1_3), files,
                                 check_interval=0)
    before = reloading.current()
    write_tls_dir(d, Credentials(key_pem(second.key), cert_pem(second.cert), cert_pem(ca.cert)))
    assert reloading.check_now() and reloading.last_error is None
    assert isinstance(reloading.current(), ssl.SSLContext) and reloading.current() is not before
    assert (d / "tls.crt").read_bytes() == cert_pem(second.cert)
    # The previous version's directory is gone: only ..data and one version remain.
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("..")) == \
        sorted(["..data", os.readlink(d / "..data")])
