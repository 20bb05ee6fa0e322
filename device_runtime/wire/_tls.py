"""TLS contexts for the link (the standard library's ``ssl``): TLS 1.2 or later, the host verified.

The host serves a certificate and its key (``split-host serve --tls-cert --tls-key``); the device
trusts the CA that signed it, or the self-signed certificate itself (``split-device --tls-ca``),
and checks that the certificate names the host it dialled — a DNS name or an IP address in the
certificate's subjectAltName. There is no switch to skip that check: a TLS link that trusts any
certificate protects against nothing but a passive listener, which the HMAC key already covers.
TLS and the per-frame HMAC are independent and may be used together.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from splitedge.errors import CredentialsError

__all__ = ["accept_tls", "client_context", "server_context"]


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


class _Early(asyncio.Protocol):
    """What the TLS layer hands up between the handshake's end and the caller taking over: asyncio
    reads the first application bytes in the same turn the handshake completes, before
    ``start_tls`` returns (a board's ``hello`` sent right behind its handshake was lost)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)


async def accept_tls(transport: asyncio.Transport, protocol: asyncio.BufferedProtocol, context: ssl.SSLContext,
                     timeout: float, made: Callable[[asyncio.BaseTransport], None] | None = None) -> None:
    """The server side of a TLS handshake on an accepted TCP ``transport``, within ``timeout`` s,
    then ``protocol`` reading from the TLS transport as if it had been made with it
    (``connection_made``, or ``made`` in its place, the bytes already decrypted, a loss meanwhile). Raises what the handshake
    raised (``ssl.SSLError``, ``OSError``, ``TimeoutError``); the transport is closed then.

    A server that counts its connections from accept (asyncio's ``create_server(ssl=...)`` makes
    the protocol only once the handshake is done, outside any cap) upgrades each connection here."""
    early = _Early()
    secured = await asyncio.get_running_loop().start_tls(transport, early, context, server_side=True,
                                                         ssl_handshake_timeout=timeout)
    if secured is None:  # closed while the handshake finished
        raise ConnectionResetError("the connection closed during the TLS handshake")
    (made or protocol.connection_made)(secured)
    secured.set_protocol(protocol)
    for chunk in early.chunks:
        view = memoryview(chunk)
        while view:
            buffer = protocol.get_buffer(len(view))
            n = min(len(buffer), len(view))
            memoryview(buffer)[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]
    if early.lost is not None:
        protocol.connection_lost(early.lost[0])
