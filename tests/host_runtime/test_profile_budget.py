"""A host announces its ``profile`` budget in ``hello`` (issue 43): a board sizes its calibration's
requests from it, so the field is checked like every other, and a hello without it (an older
host) still connects."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from device_runtime.link import HostClient
from device_runtime.wire.ops import HelloReply
from device_runtime.wire._protocol import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION, encode_message
from host_runtime.cli import build_parser
from splitedge.errors import HostUnavailableError
from tests.conftest import start_host


async def hello_of(host: str, port: int) -> HelloReply:
    client = await HostClient.connect(host, port, timeout=5.0)
    try:
        return client.hello
    finally:
        await client.close()


def test_hello_announces_the_hosts_profile_budget(mobilenet_bundle: Path) -> None:
    for host in start_host([mobilenet_bundle], profile_budget_s=0.25):
        assert asyncio.run(hello_of(host.host, host.port)).profile_budget_ms == 250.0


async def hello_from_a_fake_host(budget: object) -> HelloReply:
    """Connect to a host on 127.0.0.1 whose hello reply carries ``budget`` (absent where it is None)."""
    reply = HelloReply(1, PROTOCOL_VERSION, {"b": ["s"]}, False, DEFAULT_MAX_FRAME_BYTES, "cpu", {}, budget)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(100)  # the device's hello
            writer.writelines(encode_message(reply))
            await writer.drain()
            await reader.read(100)  # until the device hangs up
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        return await hello_of("127.0.0.1", server.sockets[0].getsockname()[1])
    finally:
        server.close()


def test_a_hello_without_a_budget_is_an_older_hosts() -> None:
    assert asyncio.run(hello_from_a_fake_host(None)).profile_budget_ms is None
    assert asyncio.run(hello_from_a_fake_host(40)).profile_budget_ms == 40.0


@pytest.mark.parametrize("budget", ["100", True, [100], -5.0, 0, 0.5, 1e12, math.inf, math.nan],
                         ids=["text", "bool", "list", "negative", "zero", "under-1-ms", "huge", "inf", "nan"])
def test_a_malformed_budget_in_hello_is_refused_in_one_line_naming_it(budget: object) -> None:
    with pytest.raises(HostUnavailableError) as info:
        asyncio.run(hello_from_a_fake_host(budget))
    message = str(info.value)
    assert "hello reply.profile_budget_ms" in message and "\n" not in message, message


@pytest.mark.parametrize("value", ["0.5", "3600001", "inf", "nan"])
def test_the_hosts_budget_flag_is_bounded_as_hello_checks_it(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "bundle", "--profile-budget-ms", value])
    assert "--profile-budget-ms" in capsys.readouterr().err
