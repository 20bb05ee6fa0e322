"""TLS contexts for the link (the standard library's ``ssl``): TLS 1.2 or later, the host verified.

The host serves a certificate and its key (``split-host serve --tls-cert --tls-key``); the device
trusts the CA that signed it, or the self-signed certificate itself (``split-device --tls-ca``),
and checks that the certificate names the host it dialled — a DNS name or an IP address in the
certificate's subjectAltName. There is no switch to skip that check: a TLS link that trusts any
certificate protects against nothing but a passive listener, which the HMAC key already covers.
TLS and the per-frame HMAC are independent and may be used together.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from splitedge import CredentialsError

__all__ = ["client_context", "server_context"]


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """The host's context: its certificate chain and private key, TLS 1.2+."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(
            f"cannot use --tls-cert {cert_file} with --tls-key {key_file}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc
    return context


def client_context(ca_file: str | Path) -> ssl.SSLContext:
    """The device's context: trusts only ``ca_file``, requires a valid certificate naming the host."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise CredentialsError(f"cannot use --tls-ca {ca_file}: {getattr(exc, 'strerror', None) or exc}") from exc
    return context
