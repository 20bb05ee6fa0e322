"""Zeroconf, the discovery half of the contract: the service type and the TXT record a host publishes.

Hosts register ``_splitedge._tcp.local.`` with a TXT record (protocol version, bundles
served, load, auth): the host builds it with :func:`txt_record` and every device reads it
with :func:`parse_txt`. A TXT record comes from anyone on the
network, so it is parsed as untrusted bytes (python-zeroconf's habit): every malformed
record (bytes that are not UTF-8, a number that is not one, an oversized list) is refused
by returning ``None`` with the reason, never by an exception that could end a device's
discovery or reconnect task.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from zeroconf import IPVersion
from zeroconf.asyncio import AsyncZeroconf

from device_runtime.wire._protocol import PROTOCOL_VERSION

__all__ = ["MAX_BUNDLES", "SERVICE_TYPE", "TxtRecord", "open_zeroconf", "parse_txt", "txt_record"]

SERVICE_TYPE = "_splitedge._tcp.local."

#: A TXT record holds at most ~9 KB (RFC 6763 §6.2 recommends < 1300 bytes); no host serves more.
MAX_BUNDLES = 256


@dataclass(frozen=True)
class TxtRecord:
    protocol: int
    bundles: tuple[str, ...]
    load: float
    auth: bool


def txt_record(bundles: Sequence[str], load: float = 0.0, auth: bool = False) -> dict[str, str]:
    return {
        "proto": str(PROTOCOL_VERSION),
        "bundles": ",".join(bundles),
        "load": f"{load:.3f}",
        "auth": "1" if auth else "0",
    }


def _text(properties: Mapping[object, object]) -> dict[str, str] | str:
    """Keys and values as text, or the reason they are not."""
    out = {}
    for key, value in properties.items():
        if not isinstance(key, (bytes, str)) or not isinstance(value, (bytes, str, type(None))):
            return "a key or value that is not bytes"
        try:
            name = key.decode("utf-8") if isinstance(key, bytes) else key
            out[name] = (value or b"").decode("utf-8") if isinstance(value, (bytes, type(None))) else value
        except UnicodeDecodeError:
            return f"key {key!r} or its value is not UTF-8"
    return out


def parse_txt(properties: Mapping[object, object]) -> tuple[TxtRecord | None, str]:
    """The record, or ``(None, why)`` for one that is malformed or of another protocol version."""
    props = _text(properties)
    if isinstance(props, str):
        return None, props
    try:
        protocol = int(props.get("proto", "0"))
        load = float(props.get("load", "0"))
    except ValueError:
        return None, f"proto {props.get('proto')!r} or load {props.get('load')!r} is not a number"
    if protocol != PROTOCOL_VERSION:
        return None, f"protocol version {protocol}, this device speaks {PROTOCOL_VERSION}"
    if not math.isfinite(load) or load < 0:
        return None, f"load {load!r} is not a finite number >= 0"
    bundles = tuple(b for b in props.get("bundles", "").split(",") if b)
    if len(bundles) > MAX_BUNDLES:
        return None, f"{len(bundles)} bundles listed, at most {MAX_BUNDLES}"
    return TxtRecord(protocol=protocol, bundles=bundles, load=load, auth=props.get("auth") == "1"), ""


def open_zeroconf(interfaces: Sequence[str] | None) -> AsyncZeroconf:
    """Zeroconf on the given interface addresses only (tests pass ``["127.0.0.1"]``)."""
    if interfaces:
        return AsyncZeroconf(interfaces=list(interfaces), ip_version=IPVersion.V4Only)
    return AsyncZeroconf(ip_version=IPVersion.V4Only)
