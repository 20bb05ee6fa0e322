"""A device without ``--tls-ca`` that dials a TLS host is told so, not "connection to host lost".

Against a real TLS host (``HostServer`` with a TLS context on 127.0.0.1), which hangs up on a
plain hello without a byte; and against fake hosts whose first bytes are a TLS record, which
a frame decoder would otherwise take for a length prefix of over 335 MB. The fake hosts also
show what is not a TLS host: one lost after answering, one whose reply the typed parser refuses.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from device_runtime.link import Credentials, HostClient
from device_runtime.wire.ops import HelloReply
from device_runtime.wire._protocol import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION, encode_message
from device_runtime.wire._tls import client_context, server_context
from splitedge.errors import AuthenticationError, HostUnavailableError
from tests.conftest import start_host
from tests.host_runtime.test_auth import make_cert

TLS_ALERT = b"\x15\x03\x03\x00\x02\x02\x46"  # alert record: fatal, protocol_version
TLS_HANDSHAKE = b"\x16\x03\x01\x00\x05" + bytes(5)  # the start of a handshake record


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: cannot make a test certificate (apt install openssl)")
    return make_cert(tmp_path_factory.mktemp("certs"), "host", "IP:127.0.0.1")


@pytest.fixture(scope="module")
def tls_host(mobilenet_bundle, cert):
    yield from start_host([mobilenet_bundle], tls=server_context(*cert))


async def stats_of(host: str, port: int, credentials: Credentials = Credentials()) -> dict:
    client = await HostClient.connect(host, port, timeout=5.0, credentials=credentials)
    try:
        return await client.stats()
    finally:
        await client.close()


def test_plain_device_against_a_tls_host_is_told_to_pass_the_ca(tls_host, cert) -> None:
    address = f"{tls_host.host}:{tls_host.port}"
    with pytest.raises(AuthenticationError, match=f"host {address} .*speaks TLS.*pass its CA certificate with --tls-ca"):
        asyncio.run(stats_of(tls_host.host, tls_host.port))
    # The same host, the CA passed: served.
    assert asyncio.run(stats_of(tls_host.host, tls_host.port, Credentials(tls=client_context(cert[0]))))["ok"] is True


async def against(respond: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                  session: Callable[[HostClient], Awaitable[object]] = HostClient.stats) -> object:
    """Connect a plain device to a fake host on 127.0.0.1 that runs ``respond`` per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await respond(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = await HostClient.connect("127.0.0.1", port, timeout=5.0)
        try:
            return await session(client)
        finally:
            await client.close()
    finally:
        server.close()


@pytest.mark.parametrize("record", [TLS_ALERT, TLS_HANDSHAKE], ids=["alert", "handshake"])
def test_a_tls_record_as_first_bytes_says_the_host_speaks_tls(record: bytes) -> None:
    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)  # the device's plain hello
        writer.write(record)
        await writer.drain()
        await reader.read(100)  # until the device hangs up

    with pytest.raises(AuthenticationError, match=r"host 127\.0\.0\.1:\d+ speaks TLS: pass its CA certificate with --tls-ca"):
        asyncio.run(against(respond))


def test_a_plain_host_lost_after_hello_is_no_tls_host() -> None:
    """Once the host has answered, a closed connection is just a lost host."""
    hello = HelloReply(1, PROTOCOL_VERSION, {}, False, DEFAULT_MAX_FRAME_BYTES, "cpu")

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.writelines(encode_message(hello))
        await writer.drain()
        await reader.read(100)  # the ping, unanswered: the host goes away

    async def ping(client: HostClient) -> float:
        assert client.hello == hello
        return await client.ping(16)

    with pytest.raises(HostUnavailableError, match="connection to host lost") as info:
        asyncio.run(against(respond, ping))
    assert not isinstance(info.value, AuthenticationError)


def test_a_malformed_reply_is_a_lost_host_naming_the_field() -> None:
    """A reply missing a field is refused by the typed parser, never a KeyError or a default value."""
    hello = HelloReply(1, PROTOCOL_VERSION, {"b": ["s"]}, False, DEFAULT_MAX_FRAME_BYTES, "cpu")

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.writelines(encode_message(hello))
        await reader.read(1 << 16)  # the infer
        writer.writelines(encode_message(HelloReply(2, PROTOCOL_VERSION, {}, False, 1, "cpu")))  # not an infer reply
        await writer.drain()
        await reader.read(100)

    async def infer(client: HostClient) -> object:
        return await client.infer("b", "s", np.zeros((1, 4), np.float32))

    with pytest.raises(HostUnavailableError, match="sent a malformed reply: infer reply.tensor: expected a tensor map"):
        asyncio.run(against(respond, infer))
