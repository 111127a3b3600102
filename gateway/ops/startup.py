"""Start-up checks that turn common mistakes into one line naming the flag that fixes them.

Every program (gateway, agent, demo, hubproxy-creds) prints ``<program>: <problem>`` on stderr
and exits 2 when it cannot start, instead of a traceback: a port in use, a kubeconfig that is
missing or not YAML, no kubeconfig outside a cluster, certificate files that do not load. The
messages never quote file contents (a kubeconfig line may hold a token): YAML errors give only
line, column and what the parser expected.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
from pathlib import Path
from typing import Any

import yaml

EXIT_CODE = 2


class StartupError(ValueError):
    """The program cannot start; ``str(exc)`` is the one line to print. A ValueError, so the
    programs' existing "bad configuration" handling (exit 2) catches it too."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what, without the offending text (``str(exc)`` quotes the file)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    if mark is not None:
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"not valid YAML: {problem}"


def read_kubeconfig(path: str, flag: str) -> dict[str, Any]:
    """The parsed kubeconfig at ``path``; StartupError naming ``flag`` if it cannot be used."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StartupError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise StartupError(f"{flag} {path}: is a directory, expected a kubeconfig file") from None
    except PermissionError:
        raise StartupError(f"{flag} {path}: permission denied") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise StartupError(f"{flag} {path}: cannot read it ({why})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StartupError(f"{flag} {path}: {yaml_problem(exc)}") from None
    if not isinstance(document, dict):
        raise StartupError(f"{flag} {path}: not a kubeconfig (expected a YAML mapping with "
                           "clusters, users and contexts)")
    if not document.get("current-context"):
        raise StartupError(f"{flag} {path}: no current-context set (kubectl config "
                           "use-context NAME --kubeconfig FILE)")
    return document


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def pod_namespace() -> str | None:
    """The namespace of the pod this runs in (its service account's), or None outside one."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None


def require_cluster_or_kubeconfig(kubeconfig: str | None, flag: str) -> None:
    """Without ``flag``, the program needs the in-cluster service account: say so plainly."""
    if kubeconfig:
        read_kubeconfig(kubeconfig, flag)
        return
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get(
            "KUBERNETES_SERVICE_PORT")):
        raise StartupError(f"not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST is "
                           f"unset): give {flag} FILE")


def check_port_free(host: str, port: int, flag: str) -> None:
    """Bind ``host:port`` for a moment (as the server will, with SO_REUSEADDR) to report a port
    in use before anything is built. Port 0 is always free."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise bind_error(exc, host, port, flag) from None


def bind_error(exc: OSError, host: str, port: int, flag: str) -> StartupError:
    """The one line for a failed listen on ``host:port`` set by ``flag``."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"{flag} {where}: the port is in use by another process; stop it "
                            f"or choose another port with {flag}")
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(f"{flag} {where}: no interface of this machine has that address; "
                            f"use 0.0.0.0 or a local address in {flag}")
    if exc.errno == errno.EACCES:
        return StartupError(f"{flag} {where}: permission denied (ports below 1024 need "
                            f"privileges); choose another port with {flag}")
    why = exc.strerror or type(exc).__name__
    return StartupError(f"{flag} {where}: cannot listen ({why})")


def _ssl_reason(exc: ssl.SSLError) -> str:
    return exc.reason or exc.strerror or type(exc).__name__


def check_ca_file(path: str, flag: str) -> None:
    """``path`` holds at least one PEM certificate usable as a trust anchor."""
    if not os.path.isfile(path):
        raise StartupError(f"{flag} {path}: no such file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise StartupError(f"{flag} {path}: no PEM CA certificate in it "
                           f"({_ssl_reason(exc)})") from None
    except OSError as exc:
        raise StartupError(f"{flag} {path}: cannot read it ({exc.strerror})") from None


def check_key_pair(directory: str, flag: str, cert: str = "tls.crt",
                   key: str = "tls.key") -> None:
    """``directory/cert`` and ``directory/key`` exist and load as a matching PEM pair."""
    if not os.path.isdir(directory):
        raise StartupError(f"{flag} {directory}: no such directory")
    cert_path, key_path = os.path.join(directory, cert), os.path.join(directory, key)
    for name, path in ((cert, cert_path), (key, key_path)):
        if not os.path.isfile(path):
            raise StartupError(f"{flag} {directory}: {name} is missing")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise StartupError(f"{flag} {directory}: {cert} and {key} do not load as a PEM "
                           f"certificate and its private key ({_ssl_reason(exc)})") from None
    except OSError as exc:
        raise StartupError(f"{flag} {directory}: cannot read {cert}/{key} "
                           f"({exc.strerror})") from None
