"""nginx as the reference reverse proxy (and as a static file server to check our upstream).

Its own prefix, config, pid file, temp dirs and logs under the benchmark's temporary folder; bound
to 127.0.0.1; runs in the foreground (``daemon off``) so the harness owns its PID.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
INSTALL_HINT = "apt-get install -y nginx-light wrk"


def version() -> str | None:
    if NGINX is None:
        return None
    out = subprocess.run([NGINX, "-v"], capture_output=True, text=True, timeout=10)
    return (out.stderr or out.stdout).strip().removeprefix("nginx version: ")


def write_config(prefix: Path, *, workers: str, proxy_port: int, static_port: int,
                 upstream_port: int, cert: str, key: str, upstream_ca: str) -> Path:
    """A TLS-terminating proxy on ``proxy_port`` and a static ``/bench.json`` on ``static_port``.

    The proxy listener offers ALPN ``h2`` and ``http/1.1`` (``listen ... ssl http2``). Proxy
    settings are the ones a careful operator uses for a Kubernetes API: HTTP/1.1 with a
    keep-alive upstream pool (nginx proxies only over HTTP/1.1), no response or request
    buffering (watches and logs stream), TLS to the upstream verified against its CA, TLS
    sessions reused.
    """
    for sub in ("logs", "tmp/client", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "html"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    from bench.upstream import POD

    (prefix / "html" / "bench.json").write_bytes(POD)
    # Started as root, nginx runs its workers as "nobody", which cannot enter our private temp
    # folder: the static check then measured 403s. Keep the workers as the invoking user.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
    conf = f"""
{user}
worker_processes {workers};
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/client;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
    upstream kube {{
        server 127.0.0.1:{upstream_port};
        keepalive 128;
        keepalive_requests 1000000;
    }}
    server {{
        # ALPN h2 and http/1.1, as the gateway offers: HTTP/1.1 clients (wrk, curl --http1.1)
        # measure "nginx", h2load measures "nginx-h2"; upstream always HTTP/1.1 keep-alive.
        listen 127.0.0.1:{proxy_port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass https://kube;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_ssl_session_reuse on;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {upstream_ca};
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
        }}
    }}
    server {{
        listen 127.0.0.1:{static_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        default_type application/json;
        location / {{ root {prefix}/html; }}
    }}
}}
"""
    path = prefix / "nginx.conf"
    path.write_text(conf)
    return path


def command(prefix: Path, conf: Path) -> list[str]:
    assert NGINX is not None
    return [NGINX, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "logs" / "error.log")]
