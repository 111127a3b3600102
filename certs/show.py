"""Describe certificates for humans: ``hubproxy certs show FILE``."""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certs.identity import CLUSTER_URI_PREFIX, validate_cluster_name


def cluster_identity(cert: x509.Certificate) -> str | None:
    """The cluster an agent certificate names in its URI SAN, or None (display only).

    The tunnel has its own, stricter check for authentication; this one is for ``show``.
    """
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(CLUSTER_URI_PREFIX):
            try:
                return validate_cluster_name(uri[len(CLUSTER_URI_PREFIX):])
            except ValueError:
                return None
    return None


def describe(cert: x509.Certificate) -> str:
    """A stable, line-oriented description: ``key: value`` lines."""
    lines = [
        f"subject: {cert.subject.rfc4514_string()}",
        f"issuer: {cert.issuer.rfc4514_string()}",
        f"serial: {cert.serial_number:x}",
        f"not before: {cert.not_valid_before_utc.isoformat()}",
        f"not after: {cert.not_valid_after_utc.isoformat()}",
        f"key: {_key_description(cert)}",
        f"is CA: {'yes' if _is_ca(cert) else 'no'}",
        f"sans: {', '.join(_sans(cert)) or '(none)'}",
        f"extended key usage: {', '.join(_eku(cert)) or '(none)'}",
    ]
    cluster = cluster_identity(cert)
    shown = cluster if cluster is not None else "(none: not an agent certificate)"
    lines.append(f"cluster: {shown}")
    return "\n".join(lines)


def _key_description(cert: x509.Certificate) -> str:
    key = cert.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA {key.key_size}"
    return type(key).__name__


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _sans(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    out = [f"DNS:{n}" for n in san.get_values_for_type(x509.DNSName)]
    out += [f"IP:{ip}" for ip in san.get_values_for_type(x509.IPAddress)]
    out += [f"URI:{u}" for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    return out


def _eku(cert: x509.Certificate) -> list[str]:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return []
    return [u._name if u._name != "Unknown OID" else u.dotted_string for u in usages]
