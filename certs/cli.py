"""Create CAs and issue gateway, tunnel-server and agent certificates.

``hubproxy certs init DIR`` writes two separate trust roots (front CA for users, tunnel CA for
the hub<->agent tunnel) and the certificates signed by them, in the Kubernetes TLS Secret layout
(``tls.crt``, ``tls.key``, ``ca.crt``). ``issue-agent`` adds one cluster later; ``show`` prints
what a certificate says. Keys are EC P-256 unless ``--key-type rsa`` (RSA-2048), written 0600,
and no existing file is replaced without ``--force``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cryptography import x509

from certs import layout
from certs.files import FileExistsRefused
from certs.issue import KEY_TYPES
from certs.show import describe


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--days", type=_positive_int, default=layout.DEFAULT_DAYS,
                        help=f"leaf certificate validity in days (default {layout.DEFAULT_DAYS})")
    parser.add_argument("--key-type", choices=KEY_TYPES, default="ec",
                        help="ec = EC P-256 (default), rsa = RSA-2048")
    parser.add_argument("--force", action="store_true",
                        help="replace existing files (default: refuse)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    init = sub.add_parser("init", help="create both CAs, serving certs and agent certs",
                          description=layout.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    init.add_argument("dir", type=Path, help="output directory")
    init.add_argument("--cluster", action="append", default=[], metavar="NAME",
                      help="issue an agent certificate for this cluster (repeatable)")
    init.add_argument("--gateway-san", action="append", default=None, metavar="NAME_OR_IP",
                      help="SAN of the :9092 cert (repeatable; default localhost, 127.0.0.1)")
    init.add_argument("--tunnel-san", action="append", default=None, metavar="NAME_OR_IP",
                      help="SAN of the :8091 cert (repeatable; default localhost, 127.0.0.1)")
    init.add_argument("--ca-days", type=_positive_int, default=layout.DEFAULT_CA_DAYS,
                      help=f"validity of the CAs in days (default {layout.DEFAULT_CA_DAYS})")
    _common(init)

    agent = sub.add_parser("issue-agent", help="issue one agent certificate from DIR/tunnel-ca")
    agent.add_argument("dir", type=Path, help="directory created by 'hubproxy certs init'")
    agent.add_argument("--cluster", required=True, metavar="NAME", help="managed cluster name")
    _common(agent)

    show = sub.add_parser("show", help="print subject, SANs, validity and cluster identity")
    show.add_argument("file", type=Path, help="PEM certificate file (every certificate in it)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.certs_command == "init":
            return _init(args)
        if args.certs_command == "issue-agent":
            return _issue_agent(args)
        return _show(args)
    except (ValueError, FileExistsRefused, FileNotFoundError, PermissionError) as exc:
        print(f"hubproxy certs: {exc}", file=sys.stderr)
        return 1


def _init(args: argparse.Namespace) -> int:
    options = layout.InitOptions(
        clusters=list(args.cluster or []),
        gateway_sans=list(args.gateway_san or layout.DEFAULT_GATEWAY_SANS),
        tunnel_sans=list(args.tunnel_san or layout.DEFAULT_TUNNEL_SANS),
        days=args.days,
        ca_days=args.ca_days,
        key_type=args.key_type,
        force=args.force,
    )
    for directory in layout.init(args.dir, options):
        print(f"wrote {directory}")
    return 0


def _issue_agent(args: argparse.Namespace) -> int:
    directory = layout.issue_agent_into(
        args.dir, args.cluster, days=args.days, key_type=args.key_type, force=args.force
    )
    print(f"wrote {directory}")
    return 0


def _show(args: argparse.Namespace) -> int:
    data = args.file.read_bytes()
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{args.file}: no PEM certificate found") from exc
    print("\n\n".join(describe(c) for c in certs))
    return 0
