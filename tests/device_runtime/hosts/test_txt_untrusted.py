"""A zeroconf TXT record comes from anyone on the network: it is parsed as untrusted bytes.

A record whose bytes are not UTF-8 used to raise ``UnicodeDecodeError`` out of discovery (the
parser caught only ``ValueError`` of its numbers), which could end a device's reconnect task.
Now every malformed record is ignored with a reason, and a good host beside it is still found.
"""

from __future__ import annotations

import asyncio
import socket

from hypothesis import given, settings
from hypothesis import strategies as st
from zeroconf.asyncio import AsyncServiceInfo

from device_runtime.hosts._discovery import discover
from device_runtime.wire._protocol import PROTOCOL_VERSION
from device_runtime.wire.txt import MAX_BUNDLES, SERVICE_TYPE, TxtRecord, open_zeroconf, parse_txt, txt_record
from host_runtime._advertise import Advertiser

LOOPBACK = ["127.0.0.1"]
GOOD = {b"proto": str(PROTOCOL_VERSION).encode(), b"bundles": b"b1,b2", b"load": b"0.250", b"auth": b"1"}


def test_a_record_built_by_a_host_reads_back() -> None:
    properties = {k.encode(): v.encode() for k, v in txt_record(["b1", "b2"], load=0.25, auth=True).items()}
    assert parse_txt(properties) == (TxtRecord(PROTOCOL_VERSION, ("b1", "b2"), 0.25, True), "")


def test_malformed_records_are_refused_with_a_reason() -> None:
    cases = {
        "not UTF-8": {**GOOD, b"bundles": b"\xff\xfe"},
        "or its value is not UTF-8": {**GOOD, b"\xc3\x28": b"x"},
        "is not a number": {**GOOD, b"load": b"lots"},
        "protocol version": {**GOOD, b"proto": b"99"},
        "finite number": {**GOOD, b"load": b"inf"},
        ">= 0": {**GOOD, b"load": b"-1"},
        f"at most {MAX_BUNDLES}": {**GOOD, b"bundles": b",".join(b"b%d" % i for i in range(MAX_BUNDLES + 1))},
    }
    for expected, properties in cases.items():
        record, why = parse_txt(properties)
        assert record is None and expected in why, (expected, why)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(st.binary(max_size=12), st.sampled_from(list(GOOD))),
                       st.one_of(st.none(), st.binary(max_size=24)), max_size=6))
def test_any_bytes_give_a_record_or_a_reason_never_an_exception(properties: dict[bytes, bytes | None]) -> None:
    record, why = parse_txt(properties)
    assert (record is None) == bool(why)


def test_discovery_survives_a_record_that_is_not_utf8_and_finds_the_good_host() -> None:
    """A real zeroconf registration on 127.0.0.1 whose TXT bytes are not UTF-8, beside a real host."""

    async def go():
        bad = AsyncServiceInfo(
            SERVICE_TYPE, f"test-garbage.{SERVICE_TYPE}", addresses=[socket.inet_aton("127.0.0.1")], port=45111,
            properties={**GOOD, b"bundles": b"\xff\xfeb1"}, server="test-garbage.local.",
        )
        zc = open_zeroconf(LOOPBACK)
        await (await zc.async_register_service(bad, allow_name_change=True))
        try:
            async with Advertiser("127.0.0.1", 45112, ["b1"], LOOPBACK, name="test-good"):
                return await discover("b1", LOOPBACK, timeout=3)
        finally:
            await zc.async_unregister_service(bad)
            await zc.async_close()

    found = asyncio.run(go())
    assert [(h.port, h.bundles) for h in found] == [(45112, ("b1",))]
